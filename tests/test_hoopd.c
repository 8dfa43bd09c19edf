/* test_hoopd.c - the rendezvous daemon for real: hoopd serves two jobs at once (one with ranks
 * requested, one with ranks assigned), reports a waiting job in its status, survives garbage and a
 * truncated message, and exits cleanly on SIGTERM. */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "procs.h"

static pid_t hoopd_pid;
static int hoopd_port;
static char hoopd_addr[64];

static void sleep_ms(int ms) {
  struct timespec pause = {ms / 1000, (long)(ms % 1000) * 1000000};
  nanosleep(&pause, NULL);
}

static int connect_hoopd(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)hoopd_port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (fd >= 0 && connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0)
    return fd;
  if (fd >= 0)
    close(fd);
  return -1;
}

static void start_hoopd(void) {
  hoopd_port = procs_free_port();
  snprintf(hoopd_addr, sizeof hoopd_addr, "127.0.0.1:%d", hoopd_port);
  char path[4096];
  snprintf(path, sizeof path, "%s", procs_build_path("tools/hoopd"));
  char *argv[] = {path, "--listen", hoopd_addr, NULL};
  hoopd_pid = procs_start(argv, NULL, NULL);
  ck_assert_int_gt(hoopd_pid, 0);
  for (int i = 0; i < 500; i++) { /* up to 5 s for it to listen */
    int fd = connect_hoopd();
    if (fd >= 0) {
      close(fd);
      return;
    }
    sleep_ms(10);
  }
  ck_abort_msg("hoopd did not start listening on %s within 5 s", hoopd_addr);
}

static void stop_hoopd(void) {
  kill(hoopd_pid, SIGTERM);
  int code = procs_wait(hoopd_pid, 10);
  ck_assert_msg(code == 0, "hoopd after SIGTERM: expected exit 0, got %d", code);
}

/* Start one rank of coll_worker in job `job` of size n through the daemon. */
static pid_t start_rank(const char *job, int n, int rank, const char *log) {
  static char env[8][128];
  snprintf(env[0], sizeof env[0], "HOOP_RENDEZVOUS=%s", hoopd_addr);
  snprintf(env[1], sizeof env[1], "HOOP_JOB=%s", job);
  snprintf(env[2], sizeof env[2], "HOOP_SIZE=%d", n);
  snprintf(env[3], sizeof env[3], "HOOP_TIMEOUT=60");
  if (rank >= 0)
    snprintf(env[4], sizeof env[4], "HOOP_RANK=%d", rank);
  else
    snprintf(env[4], sizeof env[4], "HOOP_RANK=");
  char *env_add[] = {env[0], env[1], env[2], env[3], env[4], NULL};
  char path[4096];
  snprintf(path, sizeof path, "%s", procs_build_path("tests/coll_worker"));
  char *argv[] = {path, "--quick", NULL};
  return procs_start(argv, env_add, log);
}

START_TEST(test_two_jobs_at_once) {
  start_hoopd();
  pid_t pids[5];
  /* Job "alpha": 2 ranks with requested ranks; job "beta": 3 ranks, assigned by the daemon.
   * Their ranks start interleaved. */
  pids[0] = start_rank("alpha", 2, 1, NULL);
  pids[1] = start_rank("beta", 3, -1, NULL);
  pids[2] = start_rank("alpha", 2, 0, NULL);
  pids[3] = start_rank("beta", 3, -1, NULL);
  pids[4] = start_rank("beta", 3, -1, NULL);
  for (int i = 0; i < 5; i++) {
    int code = procs_wait(pids[i], 300);
    ck_assert_msg(code == 0, "rank process %d of the two jobs: expected exit 0, got %d", i, code);
  }
  stop_hoopd();
}
END_TEST

START_TEST(test_status_and_garbage) {
  start_hoopd();
  /* Garbage, then a header that promises a huge payload, then a truncated header: each closes
   * only its own connection. */
  const char *garbage[] = {"GET / HTTP/1.0\r\n\r\n", "HOOP\x01\x00\x01\x00\xff\xff\xff\x7f",
                           "HOO"};
  size_t lengths[] = {18, 12, 3};
  for (int i = 0; i < 3; i++) {
    int fd = connect_hoopd();
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, garbage[i], lengths[i]), (ssize_t)lengths[i]);
    if (i < 2) { /* the server hangs up on the first two */
      char byte;
      struct timeval tv = {5, 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      ssize_t got;
      while ((got = read(fd, &byte, 1)) > 0)
        ;
      ck_assert_msg(got == 0, "hoopd did not close a connection that sent garbage %d", i);
    }
    close(fd);
  }
  /* One rank of a 2-rank job waits: the status names the job and the missing rank. */
  char log[] = "/tmp/hoop-status-XXXXXX";
  int log_fd = mkstemp(log);
  ck_assert_int_ge(log_fd, 0);
  close(log_fd);
  pid_t waiting = start_rank("gamma", 2, 0, NULL);
  sleep_ms(500);
  char path[4096];
  snprintf(path, sizeof path, "%s", procs_build_path("tools/hoopd"));
  char *argv[] = {path, "--status", hoopd_addr, NULL};
  ck_assert_int_eq(procs_run(argv, NULL, log, 10), 0);
  char *status = procs_slurp(log);
  ck_assert_ptr_nonnull(status);
  ck_assert_msg(strstr(status, "gamma") != NULL, "status does not list job gamma:\n%s", status);
  ck_assert_msg(strstr(status, "1/2") != NULL, "status does not say 1/2 joined:\n%s", status);
  free(status);
  unlink(log);
  /* The second rank completes the job: the daemon still serves after the garbage. */
  pid_t second = start_rank("gamma", 2, 1, NULL);
  ck_assert_int_eq(procs_wait(waiting, 120), 0);
  ck_assert_int_eq(procs_wait(second, 120), 0);
  stop_hoopd();
}
END_TEST

START_TEST(test_version_and_help) {
  char path[4096];
  const char *tools[] = {"tools/hoopd", "tools/hooprun"};
  for (int t = 0; t < 2; t++) {
    snprintf(path, sizeof path, "%s", procs_build_path(tools[t]));
    char *version[] = {path, "--version", NULL};
    char *help[] = {path, "--help", NULL};
    ck_assert_msg(procs_run(version, NULL, "/dev/null", 10) == 0, "%s --version failed", tools[t]);
    ck_assert_msg(procs_run(help, NULL, "/dev/null", 10) == 0, "%s --help failed", tools[t]);
  }
}
END_TEST

static Suite *hoopd_suite(void) {
  Suite *s = suite_create("hoopd");
  TCase *tc = tcase_create("daemon");
  tcase_set_timeout(tc, 400);
  tcase_add_test(tc, test_two_jobs_at_once);
  tcase_add_test(tc, test_status_and_garbage);
  tcase_add_test(tc, test_version_and_help);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  SRunner *sr = srunner_create(hoopd_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
