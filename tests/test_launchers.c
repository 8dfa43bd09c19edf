/* test_launchers.c - hoop_init_from_env under other launchers' variables: torchrun (MASTER_ADDR,
 * MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK), Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) and
 * Open MPI's mpirun (OMPI_COMM_WORLD_*), Kubernetes' indexed Jobs (JOB_COMPLETION_INDEX), set by
 * hand in forked ranks; HOOP_HOSTNAME; which
 * variables win when several launchers' are present; and rank 0 hosting a job under a low
 * open-file limit. */
#include <arpa/inet.h>
#include <check.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/launchers.h"
#include "hoop.h"
#include "proto/wire.h"
#include "support/procs.h"
#include "util/sockio.h"

/* Every variable a test may set, cleared in each child first so that the environment the suite
 * runs in (say, under hooprun or Slurm) cannot leak in. */
static const char *const launcher_vars[] = {"HOOP_RENDEZVOUS",
                                            "HOOP_JOB",
                                            "HOOP_SIZE",
                                            "HOOP_RANK",
                                            "HOOP_RDZV_SERVE",
                                            "HOOP_HOSTNAME",
                                            "HOOP_TIMEOUT",
                                            "MASTER_ADDR",
                                            "MASTER_PORT",
                                            "RANK",
                                            "WORLD_SIZE",
                                            "LOCAL_RANK",
                                            "TORCHELASTIC_RUN_ID",
                                            "SLURM_PROCID",
                                            "SLURM_NTASKS",
                                            "SLURM_LOCALID",
                                            "SLURM_JOB_ID",
                                            "SLURM_JOBID",
                                            "SLURM_STEP_ID",
                                            "SLURM_STEP_NODELIST",
                                            "SLURM_JOB_NODELIST",
                                            "SLURM_NODELIST",
                                            "SLURM_STEP_RESV_PORTS",
                                            "SLURMD_NODENAME",
                                            "JOB_COMPLETION_INDEX",
                                            "OMPI_COMM_WORLD_RANK",
                                            "OMPI_COMM_WORLD_SIZE",
                                            "OMPI_COMM_WORLD_LOCAL_RANK",
                                            "OMPI_COMM_WORLD_LOCAL_SIZE",
                                            "PMIX_NAMESPACE",
                                            "OMPI_MCA_ess_base_jobid",
                                            NULL};

static void clear_env(void) {
  for (int i = 0; launcher_vars[i]; i++)
    unsetenv(launcher_vars[i]);
  setenv("HOOP_TIMEOUT", "30", 1);
}

static void set_int(const char *name, int value) {
  char text[32];
  snprintf(text, sizeof text, "%d", value);
  setenv(name, text, 1);
}

/* A port that is free, with the next one free too (MASTER_PORT and the MASTER_PORT + 1 that hoop
 * uses). */
static int free_port_pair(void) {
  for (int tries = 0; tries < 50; tries++) {
    int port = procs_free_port();
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET,
                               .sin_port = htons((uint16_t)(port + 1)),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int ok =
        fd >= 0 && port > 0 && port < 65534 && bind(fd, (struct sockaddr *)&addr, sizeof addr) == 0;
    if (fd >= 0)
      close(fd);
    if (ok)
      return port;
  }
  return -1;
}

/* torchrun's own store listens on MASTER_PORT: a listener there stands in for it. */
static int listen_on(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in addr = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 16) != 0) {
    if (fd >= 0)
      close(fd);
    return -1;
  }
  return fd;
}

/* One scenario: how child index of n sets its environment, and the rank, local rank and local
 * size it must then get. */
typedef struct scenario {
  void (*set_env)(int index, int n, int port);
  int port;
  int local_per_host; /* ranks per host; 0: all on one host */
} scenario;

static int run_child(int index, int n, void *arg) {
  const scenario *sc = arg;
  clear_env();
  sc->set_env(index, n, sc->port);
  hoop_comm *comm;
  hoop_result result = hoop_init_from_env(&comm);
  if (result != HOOP_OK) {
    fprintf(stderr, "child %d: hoop_init_from_env: %s: %s\n", index, hoop_strerror(result),
            hoop_last_error(comm));
    hoop_finalize(comm);
    return 10;
  }
  int per_host = sc->local_per_host ? sc->local_per_host : n;
  int failures = 0;
  if (hoop_rank(comm) != index || hoop_size(comm) != n) {
    fprintf(stderr, "child %d: expected rank %d of %d, got %d of %d\n", index, index, n,
            hoop_rank(comm), hoop_size(comm));
    failures++;
  }
  if (hoop_local_rank(comm) != index % per_host || hoop_local_size(comm) != per_host) {
    fprintf(stderr, "child %d: expected local rank %d of %d, got %d of %d\n", index,
            index % per_host, per_host, hoop_local_rank(comm), hoop_local_size(comm));
    failures++;
  }
  /* Horovod's cross rank and size: equal hosts, so the host's index and the host count. */
  if (hoop_cross_rank(comm) != index / per_host || hoop_cross_size(comm) != n / per_host) {
    fprintf(stderr, "child %d: expected cross rank %d of %d, got %d of %d\n", index,
            index / per_host, n / per_host, hoop_cross_rank(comm), hoop_cross_size(comm));
    failures++;
  }
  int64_t value = index + 1;
  if (hoop_allreduce(comm, &value, &value, 1, HOOP_INT64, HOOP_SUM) != HOOP_OK ||
      value != (int64_t)n * (n + 1) / 2) {
    fprintf(stderr, "child %d: allreduce: expected %d, got %lld (%s)\n", index, n * (n + 1) / 2,
            (long long)value, hoop_last_error(comm));
    failures++;
  }
  hoop_finalize(comm);
  return failures;
}

static void run_scenario(int n, void (*set_env)(int, int, int), int local_per_host) {
  scenario sc = {set_env, free_port_pair(), local_per_host};
  ck_assert_int_gt(sc.port, 0);
  int bad = procs_fork_ranks(n, run_child, &sc, 60);
  ck_assert_msg(bad == 0, "%d of %d ranks failed (see stderr)", bad, n);
}

/* hoop_init_from_env, with this child's environment, must fail with code and an error that
 * holds text (and text2, unless NULL); what says so in words. 0 if it does, else 1 and why. */
static int expect_init_failure(hoop_result code, const char *text, const char *text2,
                               const char *what) {
  hoop_comm *comm;
  hoop_result result = hoop_init_from_env(&comm);
  const char *error = hoop_last_error(comm);
  int ok = result == code && strstr(error, text) && (!text2 || strstr(error, text2));
  if (!ok)
    fprintf(stderr, "expected %s, got %s: %s\n", what, hoop_strerror(result), error);
  hoop_finalize(comm);
  return ok ? 0 : 1;
}

/* ---- torchrun -------------------------------------------------------------------------------- */

static void torchrun_env(int index, int n, int port) {
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  set_int("MASTER_PORT", port);
  set_int("RANK", index);
  set_int("WORLD_SIZE", n);
  set_int("LOCAL_RANK", index);
  setenv("TORCHELASTIC_RUN_ID", "none", 1);
}

/* Rank 0 hosts the rendezvous on MASTER_PORT + 1, next to the store that holds MASTER_PORT. */
START_TEST(test_torchrun) {
  scenario sc = {torchrun_env, free_port_pair(), 0};
  ck_assert_int_gt(sc.port, 0);
  int store = listen_on(sc.port);
  ck_assert_msg(store >= 0, "cannot listen on %d to stand in for torchrun's store", sc.port);
  int bad = procs_fork_ranks(3, run_child, &sc, 60);
  close(store);
  ck_assert_msg(bad == 0, "%d of 3 torchrun-style ranks failed (see stderr)", bad);
}
END_TEST

/* torchrun's variables with HOOP_RENDEZVOUS and HOOP_RDZV_SERVE=1 given to every rank (as a
 * launcher does): only rank 0 hosts. */
static void torchrun_hoop_rendezvous_env(int index, int n, int port) {
  torchrun_env(index, n, port);
  char rendezvous[64];
  snprintf(rendezvous, sizeof rendezvous, "127.0.0.1:%d", port + 1);
  setenv("HOOP_RENDEZVOUS", rendezvous, 1);
  setenv("HOOP_RDZV_SERVE", "1", 1);
  setenv("HOOP_JOB", "own-id", 1);
}
START_TEST(test_torchrun_hoop_rendezvous) {
  run_scenario(3, torchrun_hoop_rendezvous_env, 0);
}
END_TEST

/* ---- the hosting rank's open files ----------------------------------------------------------- */

#define HOSTED_RANKS 16

/* Rank 0's open-file limit lowered to files: its soft limit only, or its hard limit too. */
static void lower_open_files(rlim_t files, int hard_too) {
  struct rlimit lim;
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0) {
    lim.rlim_cur = files;
    if (hard_too)
      lim.rlim_max = files;
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0)
      perror("setrlimit");
  }
}

/* A soft limit of 24, under the 16 connections plus what rank 0 holds itself: rank 0 raises it,
 * as far as the hard limit allows. Without that, accept() fails for want of a descriptor and
 * libuv drops those ranks at once. */
static void low_soft_limit_env(int index, int n, int port) {
  torchrun_hoop_rendezvous_env(index, n, port);
  if (index == 0)
    lower_open_files(24, 0);
}
START_TEST(test_hosting_raises_open_files) {
  run_scenario(HOSTED_RANKS, low_soft_limit_env, 0);
}
END_TEST

/* A hard limit of 48: under the 80 that rank 0 wants with room to spare, but enough for the job,
 * which runs (rank 0 only warns). */
static void tight_hard_limit_env(int index, int n, int port) {
  torchrun_hoop_rendezvous_env(index, n, port);
  if (index == 0)
    lower_open_files(48, 1);
}
START_TEST(test_hosting_tight_hard_limit) {
  run_scenario(HOSTED_RANKS, tight_hard_limit_env, 0);
}
END_TEST

/* A hard limit of 12, under the connections alone: hoop_init fails at once on rank 0, saying why
 * and what to do. */
static int low_hard_limit_child(int index, int n, void *arg) {
  (void)index, (void)n;
  clear_env();
  torchrun_hoop_rendezvous_env(0, HOSTED_RANKS, *(int *)arg);
  lower_open_files(12, 1);
  return expect_init_failure(HOOP_ERR_SYSTEM,
                             "hosting the rendezvous for 16 ranks needs about 80 open files, but "
                             "the limit is 12 and its hard limit 12",
                             NULL, "a system error naming the open-file limit");
}
START_TEST(test_hosting_over_hard_limit) {
  int port = free_port_pair();
  ck_assert_int_gt(port, 0);
  ck_assert_int_eq(procs_fork_ranks(1, low_hard_limit_child, &port, 30), 0);
}
END_TEST

/* ---- Slurm ----------------------------------------------------------------------------------- */

/* Two "nodes" of two tasks, told apart by HOOP_HOSTNAME, with rank 0 hosting the rendezvous. */
static void slurm_env(int index, int n, int port) {
  char rendezvous[64];
  snprintf(rendezvous, sizeof rendezvous, "127.0.0.1:%d", port);
  setenv("HOOP_RENDEZVOUS", rendezvous, 1);
  setenv("HOOP_RDZV_SERVE", "1", 1);
  set_int("SLURM_PROCID", index);
  set_int("SLURM_NTASKS", n);
  set_int("SLURM_LOCALID", index % 2);
  setenv("SLURM_JOB_ID", "812", 1);
  setenv("SLURM_STEP_ID", "0", 1);
  setenv("HOOP_HOSTNAME", index < 2 ? "node-a" : "node-b", 1);
}
START_TEST(test_slurm_two_nodes) {
  run_scenario(4, slurm_env, 2);
}
END_TEST

/* The job id comes from SLURM_JOB_ID and SLURM_STEP_ID: a job that times out names it. */
static int slurm_job_id_child(int index, int n, void *arg) {
  (void)index, (void)n;
  clear_env();
  char rendezvous[64];
  snprintf(rendezvous, sizeof rendezvous, "127.0.0.1:%d", *(int *)arg);
  setenv("HOOP_RENDEZVOUS", rendezvous, 1);
  setenv("HOOP_RDZV_SERVE", "1", 1);
  setenv("HOOP_TIMEOUT", "0.5", 1);
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_NTASKS", "2", 1);
  setenv("SLURM_JOB_ID", "812", 1);
  setenv("SLURM_STEP_ID", "3", 1);
  return expect_init_failure(HOOP_ERR_TIMEOUT, "'slurm-812.3'", NULL,
                             "a timeout naming job 'slurm-812.3'");
}
START_TEST(test_slurm_job_id) {
  int port = procs_free_port();
  ck_assert_int_eq(procs_fork_ranks(1, slurm_job_id_child, &port, 30), 0);
}
END_TEST

/* Slurm gives no rendezvous address: without HOOP_RENDEZVOUS the error says what to set. */
static int slurm_no_rendezvous_child(int index, int n, void *arg) {
  (void)index, (void)n, (void)arg;
  clear_env();
  setenv("SLURM_PROCID", "1", 1);
  setenv("SLURM_NTASKS", "2", 1);
  return expect_init_failure(HOOP_ERR_INVALID_ARG, "HOOP_RENDEZVOUS", "Slurm",
                             "invalid argument naming Slurm and HOOP_RENDEZVOUS");
}
START_TEST(test_slurm_needs_rendezvous) {
  ck_assert_int_eq(procs_fork_ranks(1, slurm_no_rendezvous_child, NULL, 30), 0);
}
END_TEST

/* With no address given, Slurm's ranks meet at the first node of the step's node list, on the
 * first port Slurm reserved for the step: "localhost" stands for that node here. */
static void slurm_nodelist_env(int index, int n, int port) {
  char ports[32];
  snprintf(ports, sizeof ports, "%d-%d", port, port + 1);
  setenv("SLURM_STEP_RESV_PORTS", ports, 1);
  setenv("SLURM_STEP_NODELIST", "localhost,node[02-03]", 1);
  setenv("SLURM_JOB_NODELIST", "elsewhere[1-9]", 1);
  set_int("SLURM_PROCID", index);
  set_int("SLURM_NTASKS", n);
  set_int("SLURM_LOCALID", index % 2);
  setenv("SLURM_JOB_ID", "813", 1);
  setenv("SLURM_STEP_ID", "1", 1);
  setenv("SLURMD_NODENAME", index < 2 ? "localhost" : "node02", 1);
  setenv("HOOP_HOSTNAME", index < 2 ? "localhost" : "node02", 1);
}
START_TEST(test_slurm_first_node) {
  run_scenario(4, slurm_nodelist_env, 2);
}
END_TEST

/* srun may place rank 0 elsewhere (an arbitrary distribution): it says so instead of listening
 * where nobody looks. */
static int slurm_rank0_elsewhere_child(int index, int n, void *arg) {
  (void)index, (void)n, (void)arg;
  clear_env();
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_NTASKS", "2", 1);
  setenv("SLURM_STEP_NODELIST", "node[1-2]", 1);
  setenv("SLURMD_NODENAME", "node2", 1);
  return expect_init_failure(HOOP_ERR_INVALID_ARG, "placed rank 0 on node2", "node1",
                             "invalid argument naming node2 and node1");
}
START_TEST(test_slurm_rank0_elsewhere) {
  ck_assert_int_eq(procs_fork_ranks(1, slurm_rank0_elsewhere_child, NULL, 30), 0);
}
END_TEST

/* Slurm's host lists, as scontrol show hostnames reads them (the first host only). */
START_TEST(test_slurm_host_lists) {
  static const char *const cases[][2] = {
      {"node1", "node1"},
      {"node[1-4]", "node1"},
      {"node[01-04,7]", "node01"},
      {"node[007,9-10],gpu[1-2]", "node007"},
      {"gpu3,node[1-2]", "gpu3"},
      {"rack[2-3]-n[05-06]", "rack2-n05"},
      {"10.0.0.[5-6]", "10.0.0.5"},
      {"", NULL},
      {"node[", NULL},
      {"node[]", NULL},
      {"node[a-b]", NULL},
      {"node]1", NULL},
      {",node1", NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char host[64];
    int rc = hoop__slurm_first_host(cases[i][0], host, sizeof host);
    if (cases[i][1]) {
      ck_assert_msg(rc == 0, "'%s' refused", cases[i][0]);
      ck_assert_str_eq(host, cases[i][1]);
    } else {
      ck_assert_msg(rc == -1, "'%s' accepted as '%s'", cases[i][0], host);
    }
  }
  char tiny[7];
  ck_assert_int_eq(hoop__slurm_first_host("node[100]", tiny, sizeof tiny), -1);
  ck_assert_int_eq(hoop__slurm_first_host("node[10]", tiny, sizeof tiny), 0);
  ck_assert_str_eq(tiny, "node10");
}
END_TEST

/* A rank number out of range is an error, not a hang. */
static int slurm_bad_rank_child(int index, int n, void *arg) {
  (void)index, (void)n, (void)arg;
  clear_env();
  setenv("SLURM_PROCID", "4", 1);
  setenv("SLURM_NTASKS", "4", 1);
  return expect_init_failure(HOOP_ERR_INVALID_ARG, "SLURM_PROCID", NULL,
                             "invalid argument naming SLURM_PROCID");
}
START_TEST(test_slurm_bad_rank) {
  ck_assert_int_eq(procs_fork_ranks(1, slurm_bad_rank_child, NULL, 30), 0);
}
END_TEST

/* ---- Kubernetes ------------------------------------------------------------------------------ */

/* An indexed Job: every pod has the same HOOP_ variables (the template's) and its own
 * JOB_COMPLETION_INDEX; HOOP_RDZV_SERVE=1 in the template makes index 0 alone host. */
static void indexed_job_env(int index, int n, int port) {
  char rendezvous[64], host[32];
  snprintf(rendezvous, sizeof rendezvous, "127.0.0.1:%d", port);
  setenv("HOOP_RENDEZVOUS", rendezvous, 1);
  set_int("HOOP_SIZE", n);
  setenv("HOOP_RDZV_SERVE", "1", 1);
  setenv("HOOP_JOB", "hoop-sgd", 1);
  set_int("JOB_COMPLETION_INDEX", index);
  snprintf(host, sizeof host, "hoop-sgd-%d", index);
  setenv("HOOP_HOSTNAME", host, 1);
}
START_TEST(test_indexed_job) {
  run_scenario(4, indexed_job_env, 1);
}
END_TEST

/* An index out of the job's size is an error naming it. */
static int indexed_job_bad_child(int index, int n, void *arg) {
  (void)index, (void)n, (void)arg;
  clear_env();
  setenv("HOOP_SIZE", "2", 1);
  setenv("HOOP_RENDEZVOUS", "127.0.0.1:1", 1);
  setenv("JOB_COMPLETION_INDEX", "2", 1);
  return expect_init_failure(HOOP_ERR_INVALID_ARG, "JOB_COMPLETION_INDEX", NULL,
                             "invalid argument naming JOB_COMPLETION_INDEX");
}
START_TEST(test_indexed_job_bad_index) {
  ck_assert_int_eq(procs_fork_ranks(1, indexed_job_bad_child, NULL, 30), 0);
}
END_TEST

/* A rendezvous name that does not resolve (yet: a pod's DNS record appears once it runs) is tried
 * again until HOOP_TIMEOUT, then named in a timeout. */
static int unresolved_child(int index, int n, void *arg) {
  (void)index, (void)n, (void)arg;
  clear_env();
  setenv("HOOP_SIZE", "2", 1);
  setenv("HOOP_RANK", "1", 1);
  setenv("HOOP_RENDEZVOUS", "hoop-sgd-0.nowhere.invalid:29400", 1);
  setenv("HOOP_TIMEOUT", "0.6", 1);
  return expect_init_failure(HOOP_ERR_TIMEOUT, "hoop-sgd-0.nowhere.invalid", "tried for",
                             "a timeout naming the host");
}
START_TEST(test_rendezvous_name_waited_for) {
  ck_assert_int_eq(procs_fork_ranks(1, unresolved_child, NULL, 30), 0);
}
END_TEST

/* ---- a rank hosting the rendezvous: its own job alone ------------------------------------------
 */

/* One init of this process under job, size, rank and timeout at port; 0 if it ends with code and
 * an error holding text (text NULL: HOOP_OK, then an allreduce of the two ranks). */
static int init_as(int port, const char *job, int size, int rank, const char *timeout, int serve,
                   hoop_result code, const char *text) {
  char rendezvous[64];
  snprintf(rendezvous, sizeof rendezvous, "127.0.0.1:%d", port);
  clear_env();
  setenv("HOOP_RENDEZVOUS", rendezvous, 1);
  setenv("HOOP_JOB", job, 1);
  set_int("HOOP_SIZE", size);
  set_int("HOOP_RANK", rank);
  setenv("HOOP_TIMEOUT", timeout, 1);
  setenv("HOOP_RDZV_SERVE", serve ? "1" : "0", 1);
  if (text)
    return expect_init_failure(code, text, NULL, text);
  hoop_comm *comm;
  hoop_result result = hoop_init_from_env(&comm);
  int64_t value = rank + 1;
  int bad = result != HOOP_OK ||
            hoop_allreduce(comm, &value, &value, 1, HOOP_INT64, HOOP_SUM) != HOOP_OK || value != 3;
  if (bad)
    fprintf(stderr, "rank %d of job '%s': %s (%s)\n", rank, job, hoop_strerror(result),
            hoop_last_error(comm));
  hoop_finalize(comm);
  return bad;
}

/* Rank 0 hosts job 'real' of 2 ranks. Before rank 1 comes, strangers who reach the port send
 * HELLOs for 'real' with another size and for another job with a timeout of 0.3 s: each is
 * refused at once, and neither ends the server's wait (before, the first foreign job to complete
 * or time out stopped it listening, and the real job never formed). Without a token, a stranger
 * who knows the job id and size can still join it: the warning below says so. */
static int stranger_child(int index, int n, void *arg) {
  (void)n;
  int port = *(int *)arg;
  if (index == 0)
    return init_as(port, "real", 2, 0, "30", 1, HOOP_OK, NULL) == 0 ? 0 : 1;
  int bad = 0;
  /* The first waits (5 s) for rank 0 to listen; the second's 0.3 s would have ended it before. */
  bad += init_as(port, "real", 3, 2, "5", 0, HOOP_ERR_INVALID_ARG, "serves one job only");
  bad += init_as(port, "other", 2, 0, "0.3", 0, HOOP_ERR_INVALID_ARG, "serves one job only");
  usleep(500 * 1000); /* past the stranger's 0.3 s: had its job been taken, it would be over */
  bad += init_as(port, "real", 2, 1, "30", 0, HOOP_OK, NULL);
  return bad;
}
START_TEST(test_hosting_admits_its_job_alone) {
  int port = procs_free_port();
  ck_assert_int_gt(port, 0);
  ck_assert_int_eq(procs_fork_ranks(2, stranger_child, &port, 60), 0);
}
END_TEST

/* A squatter took the rendezvous port before the real server: it asks for a proof as a server
 * with a token would, reads the rank's HELLO and hands it a table of its own (naming itself), with
 * a TABLE_PROOF it cannot make. The rank holds the token and must refuse the table, naming the
 * address, instead of connecting to whom the table names (who would then read its data). */
static int squatter_child(int index, int n, void *arg) {
  (void)n;
  int port = *(int *)arg;
  if (index == 1) {
    usleep(200 * 1000); /* the squatter listens first */
    clear_env();
    char rendezvous[64];
    snprintf(rendezvous, sizeof rendezvous, "127.0.0.1:%d", port);
    setenv("HOOP_RENDEZVOUS", rendezvous, 1);
    setenv("HOOP_SIZE", "2", 1);
    setenv("HOOP_RANK", "1", 1);
    setenv("HOOP_TOKEN", "the-real-job-token", 1);
    setenv("HOOP_TIMEOUT", "10", 1);
    return expect_init_failure(HOOP_ERR_AUTH, "without proving", rendezvous,
                               "an authentication failure naming the squatted address");
  }
  int fd = listen_on(port), conn = fd >= 0 ? accept(fd, NULL, NULL) : -1;
  double deadline = hoop__now() + 10;
  hoop__wbuf out = {0};
  hoop__challenge challenge = {.flags = HOOP__CHALLENGE_AUTH};
  uint8_t head[HOOP__WIRE_HEADER_SIZE], *hello = NULL;
  hoop__wire_header header;
  int bad =
      conn < 0 || hoop__wire_encode_challenge(&out, &challenge) != 0 ||
      hoop__write_full(conn, out.data, out.len, deadline) != 0 ||
      hoop__read_full(conn, head, sizeof head, deadline) != 0 ||
      hoop__wire_decode_header(head, sizeof head, HOOP__WIRE_MAX_CLIENT_PAYLOAD, &header) != 0 ||
      !(hello = malloc(header.length + 1)) ||
      hoop__read_full(conn, hello, header.length, deadline) != 0;
  free(hello);
  hoop__wbuf_free(&out);
  hoop__peer_entry peers[2] = {{.host = "squat", .addr = "127.0.0.1:1", .local_size = 1},
                               {.host = "squat", .addr = "127.0.0.1:2", .local_size = 1}};
  hoop__table table = {.size = 2, .rank = 1, .peers = peers};
  hoop__table_proof forged = {.proof_len = 32};
  memset(forged.proof, 0x5a, sizeof forged.proof);
  if (!bad)
    bad = hoop__wire_encode_table(&out, &table) != 0 ||
          hoop__wire_encode_table_proof(&out, &forged) != 0 ||
          hoop__write_full(conn, out.data, out.len, deadline) != 0;
  hoop__wbuf_free(&out);
  char byte;
  if (conn >= 0)
    (void)read(conn, &byte, 1); /* until the rank closes */
  if (conn >= 0)
    close(conn);
  if (fd >= 0)
    close(fd);
  if (bad)
    fprintf(stderr, "the squatter could not play its part\n");
  return bad;
}
START_TEST(test_squatter_table_refused) {
  int port = procs_free_port();
  ck_assert_int_gt(port, 0);
  ck_assert_int_eq(procs_fork_ranks(2, squatter_child, &port, 60), 0);
}
END_TEST

/* A non-loopback IPv4 address of this host into out, or 0 when it has none. */
static int outside_address(char *out, size_t len) {
  struct ifaddrs *list = NULL;
  int found = 0;
  if (getifaddrs(&list) != 0)
    return 0;
  for (struct ifaddrs *ifa = list; ifa && !found; ifa = ifa->ifa_next) {
    if (!ifa->ifa_addr || ifa->ifa_addr->sa_family != AF_INET)
      continue;
    const struct in_addr *in = &((const struct sockaddr_in *)ifa->ifa_addr)->sin_addr;
    if ((ntohl(in->s_addr) >> 24) == 127)
      continue;
    found = inet_ntop(AF_INET, in, out, (socklen_t)len) != NULL;
  }
  freeifaddrs(list);
  return found;
}

/* Without a token, on an address other hosts reach or on loopback: rank 0 warns once (twice
 * initialized here), naming HOOP_TOKEN_FILE, the other ranks not at all (one line per job, not per
 * rank), and rank 0 listens on that address alone. */
typedef struct warn_arg {
  char addr[64];
  int port;
  char dir[64];
} warn_arg;
static int no_token_child(int index, int n, void *arg) {
  const warn_arg *w = arg;
  char path[128], rendezvous[96], expect[128];
  snprintf(path, sizeof path, "%s/stderr.%d", w->dir, index);
  if (!freopen(path, "w", stderr))
    return 1;
  int bad = 0;
  for (int round = 0; round < 2; round++) {
    clear_env();
    snprintf(rendezvous, sizeof rendezvous, "%s:%d", w->addr, w->port + round);
    setenv("HOOP_RENDEZVOUS", rendezvous, 1);
    set_int("HOOP_SIZE", n);
    set_int("HOOP_RANK", index);
    setenv("HOOP_RDZV_SERVE", index == 0 ? "1" : "0", 1);
    setenv("HOOP_DEBUG", "info", 1);
    hoop_comm *comm;
    hoop_result result = hoop_init_from_env(&comm);
    bad += result != HOOP_OK;
    hoop_finalize(comm);
  }
  fflush(stderr);
  FILE *f = fopen(path, "r");
  char line[1024];
  int warnings = 0, exact = 0;
  snprintf(expect, sizeof expect, "hosting the rendezvous for job 'default' on %s:%d", w->addr,
           w->port);
  while (f && fgets(line, sizeof line, f)) {
    warnings += strstr(line, "has no token") && strstr(line, "HOOP_TOKEN_FILE");
    exact += strstr(line, expect) != NULL;
  }
  if (f)
    fclose(f);
  if (warnings != (index == 0) || (index == 0 && exact != 1)) {
    fprintf(stdout, "rank %d: %d warnings (want %d), %d lines '%s'\n", index, warnings, index == 0,
            exact, expect);
    bad++;
  }
  return bad;
}
START_TEST(test_no_token_warns_once) {
  warn_arg w;
  if (_i == 1 && !outside_address(w.addr, sizeof w.addr))
    ck_abort_msg("no address but loopback here: the warning off loopback cannot be checked");
  if (_i == 0)
    snprintf(w.addr, sizeof w.addr, "127.0.0.1");
  w.port = free_port_pair();
  ck_assert_int_gt(w.port, 0);
  snprintf(w.dir, sizeof w.dir, "/tmp/hoop-warn-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(w.dir));
  int bad = procs_fork_ranks(2, no_token_child, &w, 60);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", w.dir);
  ck_assert_int_eq(system(cmd), 0);
  ck_assert_int_eq(bad, 0);
}
END_TEST

/* ---- Open MPI -------------------------------------------------------------------------------- */

/* All ranks on this host and no address given: rank 0 hosts on a loopback port of the job's. */
static void ompi_env(int index, int n, int port) {
  char name[64];
  snprintf(name, sizeof name, "test-launchers-%d-%d", (int)getppid(), port);
  setenv("PMIX_NAMESPACE", name, 1);
  set_int("OMPI_COMM_WORLD_RANK", index);
  set_int("OMPI_COMM_WORLD_SIZE", n);
  set_int("OMPI_COMM_WORLD_LOCAL_RANK", index);
  set_int("OMPI_COMM_WORLD_LOCAL_SIZE", n);
}
START_TEST(test_ompi_one_host) {
  run_scenario(3, ompi_env, 0);
}
END_TEST

/* ---- which variables win --------------------------------------------------------------------- */

/* torchrun's workers may be Slurm tasks: torchrun's numbers are the workers' own. */
static void torchrun_under_slurm_env(int index, int n, int port) {
  torchrun_env(index, n, port);
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_NTASKS", "1", 1);
}
START_TEST(test_torchrun_under_slurm) {
  run_scenario(2, torchrun_under_slurm_env, 0);
}
END_TEST

/* HOOP_SIZE set: the HOOP_ variables alone count, whatever else is set. */
static void hoop_wins_env(int index, int n, int port) {
  char rendezvous[64];
  snprintf(rendezvous, sizeof rendezvous, "127.0.0.1:%d", port);
  setenv("HOOP_RENDEZVOUS", rendezvous, 1);
  set_int("HOOP_SIZE", n);
  set_int("HOOP_RANK", index);
  if (index == 0)
    setenv("HOOP_RDZV_SERVE", "1", 1);
  setenv("MASTER_ADDR", "192.0.2.1", 1); /* TEST-NET-1: would never answer */
  setenv("MASTER_PORT", "1", 1);
  setenv("RANK", "7", 1);
  setenv("WORLD_SIZE", "9", 1);
  setenv("SLURM_PROCID", "5", 1);
  setenv("SLURM_NTASKS", "6", 1);
}
START_TEST(test_hoop_variables_win) {
  run_scenario(2, hoop_wins_env, 0);
}
END_TEST

static Suite *launchers_suite(void) {
  Suite *s = suite_create("launchers");
  TCase *tc = tcase_create("torchrun");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_torchrun);
  tcase_add_test(tc, test_torchrun_hoop_rendezvous);
  tcase_add_test(tc, test_torchrun_under_slurm);
  suite_add_tcase(s, tc);
  tc = tcase_create("hosting");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_hosting_raises_open_files);
  tcase_add_test(tc, test_hosting_tight_hard_limit);
  tcase_add_test(tc, test_hosting_over_hard_limit);
  tcase_add_test(tc, test_hosting_admits_its_job_alone);
  tcase_add_loop_test(tc, test_no_token_warns_once, 0, 2);
  tcase_add_test(tc, test_squatter_table_refused);
  suite_add_tcase(s, tc);
  tc = tcase_create("slurm");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_slurm_two_nodes);
  tcase_add_test(tc, test_slurm_job_id);
  tcase_add_test(tc, test_slurm_needs_rendezvous);
  tcase_add_test(tc, test_slurm_bad_rank);
  tcase_add_test(tc, test_slurm_first_node);
  tcase_add_test(tc, test_slurm_rank0_elsewhere);
  tcase_add_test(tc, test_slurm_host_lists);
  suite_add_tcase(s, tc);
  tc = tcase_create("kubernetes");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_indexed_job);
  tcase_add_test(tc, test_indexed_job_bad_index);
  tcase_add_test(tc, test_rendezvous_name_waited_for);
  suite_add_tcase(s, tc);
  tc = tcase_create("openmpi");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_ompi_one_host);
  suite_add_tcase(s, tc);
  tc = tcase_create("precedence");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_hoop_variables_win);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(launchers_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
