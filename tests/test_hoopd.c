/* test_hoopd.c - the rendezvous daemon for real: hoopd serves two jobs at once (one with ranks
 * requested, one with ranks assigned), reports a waiting job in its status, survives garbage and a
 * truncated message, and exits cleanly on SIGTERM. */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hoop.h"
#include "proto/wire.h"
#include "support/procs.h"

static pid_t hoopd_pid;
static int hoopd_port;
static char hoopd_addr[64];

static void sleep_ms(int ms) {
  struct timespec pause = {ms / 1000, (long)(ms % 1000) * 1000000};
  nanosleep(&pause, NULL);
}

static int connect_hoopd(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)hoopd_port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (fd >= 0 && connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0)
    return fd;
  if (fd >= 0)
    close(fd);
  return -1;
}

/* Start argv (hoopd, perhaps behind a wrapper; hoopd_addr already chosen), its output into log
 * unless NULL, and wait until it listens. */
static void start_hoopd_argv(char *const argv[], const char *log) {
  hoopd_pid = procs_start(argv, NULL, log);
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

static void pick_hoopd_addr(void) {
  hoopd_port = procs_free_port();
  snprintf(hoopd_addr, sizeof hoopd_addr, "127.0.0.1:%d", hoopd_port);
}

/* Start hoopd, with --token-file token_file unless NULL. */
static void start_hoopd_with(const char *token_file) {
  pick_hoopd_addr();
  char path[4096];
  snprintf(path, sizeof path, "%s", procs_build_path("tools/hoopd"));
  char *argv[] = {path, "--listen", hoopd_addr, "--token-file", (char *)token_file, NULL};
  if (!token_file)
    argv[3] = NULL;
  start_hoopd_argv(argv, NULL);
}

static void start_hoopd(void) {
  start_hoopd_with(NULL);
}

static void stop_hoopd(void) {
  kill(hoopd_pid, SIGTERM);
  int code = procs_wait(hoopd_pid, 10);
  ck_assert_msg(code == 0, "hoopd after SIGTERM: expected exit 0, got %d", code);
}

/* Start one rank of coll_worker in job `job` of size n through the daemon, with `secret` (e.g.
 * "HOOP_TOKEN=..." or "HOOP_TOKEN_FILE=...") in its environment unless NULL. */
static pid_t start_rank_with(const char *job, int n, int rank, const char *log,
                             const char *secret) {
  static char env[8][256];
  snprintf(env[0], sizeof env[0], "HOOP_RENDEZVOUS=%s", hoopd_addr);
  snprintf(env[1], sizeof env[1], "HOOP_JOB=%s", job);
  snprintf(env[2], sizeof env[2], "HOOP_SIZE=%d", n);
  snprintf(env[3], sizeof env[3], "HOOP_TIMEOUT=60");
  if (rank >= 0)
    snprintf(env[4], sizeof env[4], "HOOP_RANK=%d", rank);
  else
    snprintf(env[4], sizeof env[4], "HOOP_RANK=");
  snprintf(env[5], sizeof env[5], "%s", secret ? secret : "HOOP_TOKEN=");
  char *env_add[] = {env[0], env[1], env[2], env[3], env[4], env[5], NULL};
  char path[4096];
  snprintf(path, sizeof path, "%s", procs_build_path("tests/coll_worker"));
  char *argv[] = {path, "--quick", NULL};
  return procs_start(argv, env_add, log);
}

static pid_t start_rank(const char *job, int n, int rank, const char *log) {
  return start_rank_with(job, n, rank, log, NULL);
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
  const char *garbage[] = {"GET / HTTP/1.0\r\n\r\n", "HOOP\x01\x00\x01\x00\xff\xff\xff\x7f", "HOO"};
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
  ck_assert_msg(strstr(status, "joined from: ") != NULL && strstr(status, "(1 rank)") != NULL,
                "status does not name the host that joined:\n%s", status);
  free(status);
  unlink(log);
  /* The second rank completes the job: the daemon still serves after the garbage. */
  pid_t second = start_rank("gamma", 2, 1, NULL);
  ck_assert_int_eq(procs_wait(waiting, 120), 0);
  ck_assert_int_eq(procs_wait(second, 120), 0);
  stop_hoopd();
}
END_TEST

/* A temporary file holding text, with mode; its path is written to path (>= 32 bytes). */
static void write_file(char *path, const char *text, mode_t mode) {
  strcpy(path, "/tmp/hoop-token-XXXXXX");
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  ck_assert_int_eq(fchmod(fd, mode), 0);
  close(fd);
}

/* The output a process left in log holds `expected`. */
static void expect_log_has(const char *log, const char *expected, const char *who) {
  char *output = procs_slurp(log);
  ck_assert_msg(output && strstr(output, expected), "%s: expected '%s' in its output, got:\n%s",
                who, expected, output ? output : "(nothing)");
  free(output);
}

/* A process that must fail: its exit status is not 0 and its output holds `expected`. */
static void expect_failed_with(pid_t pid, const char *log, const char *expected, const char *who) {
  int code = procs_wait(pid, 120);
  ck_assert_msg(code != 0, "%s: expected a failure, got exit 0", who);
  expect_log_has(log, expected, who);
}

#define HOOP_TEST_LONG_TOKEN 1025

/* hoopd with a token file: ranks that hold the token (from HOOP_TOKEN_FILE or HOOP_TOKEN) complete
 * their job; a wrong token, no token, and a status query without it are refused with a message,
 * and neither the job nor the daemon is harmed. */
START_TEST(test_token_keeps_strangers_out) {
  char token_file[64], loose_file[64], log[] = "/tmp/hoop-auth-XXXXXX";
  write_file(token_file, "a job secret 7f3a9c\n", 0600);
  write_file(loose_file, "a job secret 7f3a9c\n", 0644);
  int log_fd = mkstemp(log);
  ck_assert_int_ge(log_fd, 0);
  close(log_fd);
  char hoopd[4096], token_env[128], loose_env[128];
  snprintf(hoopd, sizeof hoopd, "%s", procs_build_path("tools/hoopd"));
  snprintf(token_env, sizeof token_env, "HOOP_TOKEN_FILE=%s", token_file);
  snprintf(loose_env, sizeof loose_env, "HOOP_TOKEN_FILE=%s", loose_file);

  /* A token file that others may read is refused, by the daemon and by a rank alike. */
  char *loose_argv[] = {hoopd, "--listen", "127.0.0.1:0", "--token-file", loose_file, NULL};
  ck_assert_int_eq(procs_run(loose_argv, NULL, log, 10), 2);
  expect_log_has(log, "chmod 600", "hoopd with a mode 644 token file");
  start_hoopd_with(token_file);
  expect_failed_with(start_rank_with("delta", 2, 0, log, loose_env), log, "chmod 600",
                     "a rank with a mode 644 token file");

  pid_t first = start_rank_with("delta", 2, 0, NULL, token_env);
  sleep_ms(300);
  expect_failed_with(start_rank_with("delta", 2, 1, log, "HOOP_TOKEN=a job secret 7f3a9d"), log,
                     "authentication failed", "a rank with a wrong token");
  expect_failed_with(start_rank_with("delta", 2, 1, log, NULL), log, "requires a token",
                     "a rank without a token");
  char *status_argv[] = {hoopd, "--status", hoopd_addr, NULL};
  ck_assert_int_ne(procs_run(status_argv, NULL, log, 10), 0);
  expect_log_has(log, "requires a token", "hoopd --status without the token");
  char *status_env[] = {token_env, NULL};
  ck_assert_int_eq(procs_run(status_argv, status_env, log, 10), 0);
  expect_log_has(log, "delta                    1/2", "hoopd --status with the token");
  /* hoopd takes its token as hooprun and the ranks do: both variables set is refused, as is a
   * token over 1024 bytes, and --token-file overrides the environment. */
  char *both_env[] = {token_env, "HOOP_TOKEN=a job secret 7f3a9c", NULL};
  ck_assert_int_eq(procs_run(status_argv, both_env, log, 10), 2);
  expect_log_has(log, "both HOOP_TOKEN and HOOP_TOKEN_FILE are set", "hoopd with both set");
  static char long_env[HOOP_TEST_LONG_TOKEN + 16];
  snprintf(long_env, sizeof long_env, "HOOP_TOKEN=%0*d", HOOP_TEST_LONG_TOKEN, 7);
  char *long_argv[] = {long_env, NULL};
  ck_assert_int_eq(procs_run(status_argv, long_argv, log, 10), 2);
  expect_log_has(log, "longer than 1024 bytes", "hoopd with a 1025-byte HOOP_TOKEN");
  char *override_argv[] = {hoopd, "--status", hoopd_addr, "--token-file", token_file, NULL};
  char *wrong_env[] = {"HOOP_TOKEN=a job secret 7f3a9d", NULL};
  ck_assert_int_eq(procs_run(override_argv, wrong_env, log, 10), 0);
  expect_log_has(log, "delta                    1/2",
                 "hoopd --status --token-file over HOOP_TOKEN");
  /* The job goes on: the second rank, with the token given directly, completes it. */
  pid_t second = start_rank_with("delta", 2, 1, NULL, "HOOP_TOKEN=a job secret 7f3a9c");
  ck_assert_int_eq(procs_wait(first, 120), 0);
  ck_assert_int_eq(procs_wait(second, 120), 0);
  stop_hoopd();
  unlink(token_file);
  unlink(loose_file);
  unlink(log);
}
END_TEST

/* A rank with a token never joins a daemon that admits anyone. */
START_TEST(test_token_needs_an_authenticating_server) {
  char log[] = "/tmp/hoop-auth-XXXXXX";
  int log_fd = mkstemp(log);
  ck_assert_int_ge(log_fd, 0);
  close(log_fd);
  start_hoopd();
  expect_failed_with(start_rank_with("epsilon", 2, 0, log, "HOOP_TOKEN=secret"), log,
                     "asks for none", "a rank with a token at an open daemon");
  stop_hoopd();
  unlink(log);
}
END_TEST

/* The type of the first message the daemon sends on fd (within 5 s), or -1 when it sends none;
 * an ERROR's text, if any, into text. */
static int first_message(int fd, char *text, size_t cap) {
  text[0] = '\0';
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  uint8_t buf[4096];
  size_t got = 0;
  hoop__wire_header header;
  int rc = 1;
  while (rc == 1 || (rc == 0 && got < HOOP__WIRE_HEADER_SIZE + header.length)) {
    ssize_t n = recv(fd, buf + got, sizeof buf - got, 0);
    if (n <= 0)
      return -1;
    got += (size_t)n;
    if (rc == 1)
      rc = hoop__wire_decode_header(buf, got, sizeof buf - HOOP__WIRE_HEADER_SIZE, &header);
    if (rc < 0)
      return -1;
  }
  hoop__error_msg error;
  if (header.type == HOOP_MSG_ERROR &&
      hoop__wire_decode_error(buf + HOOP__WIRE_HEADER_SIZE, header.length, &error) == 0) {
    snprintf(text, cap, "%s", error.message);
  }
  return header.type;
}

/* 1 while hoopd holds fd open (what it sent is read and dropped), 0 once it closed it. */
static int still_open(int fd) {
  char buf[256];
  ssize_t got;
  while ((got = recv(fd, buf, sizeof buf, MSG_DONTWAIT)) > 0)
    ;
  return got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

/* Start hoopd on a fresh address with the option `option value`, its output into a new file
 * named from the mkstemp template log. */
static void start_hoopd_logging(char *log, const char *option, const char *value) {
  pick_hoopd_addr();
  char path[4096];
  snprintf(path, sizeof path, "%s", procs_build_path("tools/hoopd"));
  int log_fd = mkstemp(log);
  ck_assert_int_ge(log_fd, 0);
  close(log_fd);
  char *argv[] = {path, "--listen", hoopd_addr, (char *)option, (char *)value, NULL};
  start_hoopd_argv(argv, log);
}

/* Open `count` silent connections to hoopd: each must get its challenge (hoopd makes room by
 * closing the oldest silent ones, never refusing while some are silent), and `held` of them, the
 * newest, must stay open: all, or as many as hoopd serves at once. start_hoopd_argv's probe may
 * still be counted (one fewer held). */
static void expect_connections_held(int count, int held) {
  static int fds[512];
  ck_assert_int_le(count, 512);
  for (int i = 0; i < count; i++) {
    fds[i] = connect_hoopd();
    ck_assert_msg(fds[i] >= 0, "connection %d to hoopd: %s", i, strerror(errno));
  }
  for (int i = 0; i < count; i++) {
    char text[HOOP__WIRE_MAX_MESSAGE + 1] = "";
    int type = first_message(fds[i], text, sizeof text);
    ck_assert_msg(type == HOOP_MSG_CHALLENGE,
                  "connection %d of %d: expected the challenge, got message type %d (-1: none) "
                  "'%s'",
                  i, count, type, text);
  }
  sleep_ms(500); /* the closings hoopd made, arrived */
  int open = 0;
  for (int i = 0; i < count; i++)
    open += still_open(fds[i]);
  ck_assert_msg(open == held || open == held - 1, "%d of %d silent connections held, expected %d",
                open, count, held);
  for (int i = 0; i < count; i++)
    close(fds[i]);
}

/* hoopd raises a soft open-file limit of 100 as its connections need (300 silent ones are all
 * held); under a hard limit of 100 it serves 50 at once (100 less what it keeps for itself): of
 * 60 silent ones, each gets its challenge and 50 are held, the oldest closed to make room for the
 * newest; it says so at start. A job still completes after each. */
START_TEST(test_open_file_limit) {
  struct rlimit own;
  ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &own), 0);
  if (own.rlim_cur != RLIM_INFINITY && own.rlim_cur < 400) {
    /* This process opens 300 connections: a soft limit below that is raised where the hard one
     * lets it; a part left out says so, for CI's gate (.ci/gate). */
    own.rlim_cur = own.rlim_max == RLIM_INFINITY || own.rlim_max >= 400 ? 400 : own.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &own) != 0 || own.rlim_cur < 400) {
      printf("SKIP-PART: test_open_file_limit: this process may open only %lu files (hard limit)\n",
             (unsigned long)own.rlim_max);
      return;
    }
  }
  char log[] = "/tmp/hoop-nofile-XXXXXX";
  int log_fd = mkstemp(log);
  ck_assert_int_ge(log_fd, 0);
  close(log_fd);
  char hoopd[4096];
  snprintf(hoopd, sizeof hoopd, "%s", procs_build_path("tools/hoopd"));
  const char *limits[] = {"--nofile=100:", "--nofile=100:100"};
  int held[] = {300, 50};
  for (int k = 0; k < 2; k++) {
    pick_hoopd_addr();
    char *argv[] = {"prlimit", (char *)limits[k], hoopd, "--listen", hoopd_addr, NULL};
    start_hoopd_argv(argv, log);
    expect_connections_held(held[k] == 300 ? 300 : 60, held[k]);
    pid_t ranks[2] = {start_rank("kappa", 2, -1, NULL), start_rank("kappa", 2, -1, NULL)};
    for (int i = 0; i < 2; i++)
      ck_assert_msg(procs_wait(ranks[i], 120) == 0, "rank %d after the connections (%s)", i,
                    limits[k]);
    stop_hoopd();
  }
  expect_log_has(log, "serving at most 50 connections at once, not 4096",
                 "hoopd under a hard open-file limit of 100");
  unlink(log);
}
END_TEST

/* Bytes at a connection of its own, closed at once or left open (returned) for the daemon to
 * deal with. */
static int send_raw(const void *bytes, size_t len) {
  int fd = connect_hoopd();
  ck_assert_int_ge(fd, 0);
  if (len > 0)
    ck_assert_int_eq(send(fd, bytes, len, MSG_NOSIGNAL), (ssize_t)len);
  return fd;
}

/* 1 once the daemon has closed fd (EOF or reset), reading and discarding what it sent first; 0 if
 * it still holds it after timeout_ms. */
static int closed_within(int fd, int timeout_ms) {
  struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[256];
  ssize_t got;
  while ((got = recv(fd, buf, sizeof buf, 0)) > 0)
    ;
  return got == 0 || (got < 0 && errno == ECONNRESET);
}

/* While a real job waits for its second rank, hoopd (idle timeout 2 s) gets random bytes, a
 * truncated HELLO, a header announcing 2 GiB, a client that never reads, and a slow client that
 * sends a HELLO one byte every 100 ms; each loses only its own connection, the job completes and
 * the daemon still answers. */
START_TEST(test_hostile_clients_during_a_job) {
  hoopd_port = procs_free_port();
  snprintf(hoopd_addr, sizeof hoopd_addr, "127.0.0.1:%d", hoopd_port);
  char path[4096];
  snprintf(path, sizeof path, "%s", procs_build_path("tools/hoopd"));
  char *argv[] = {path, "--listen", hoopd_addr, "--idle-timeout", "2", NULL};
  char log[] = "/tmp/hoop-hostile-XXXXXX";
  int log_fd = mkstemp(log);
  ck_assert_int_ge(log_fd, 0);
  close(log_fd);
  hoopd_pid = procs_start(argv, NULL, log);
  ck_assert_int_gt(hoopd_pid, 0);
  int fd;
  for (int i = 0; (fd = connect_hoopd()) < 0 && i < 500; i++)
    sleep_ms(10);
  ck_assert_msg(fd >= 0, "hoopd did not listen on %s", hoopd_addr);
  close(fd);
  pid_t first = start_rank("zeta", 2, 0, NULL);

  int open_fds[64], nopen = 0;
  unsigned seed = 12345;
  uint8_t junk[600];
  for (int i = 0; i < 32; i++) {
    size_t len = 1 + (size_t)(rand_r(&seed) % (int)sizeof junk);
    for (size_t b = 0; b < len; b++)
      junk[b] = (uint8_t)rand_r(&seed);
    if (i % 4 == 0) /* a real magic and version, then garbage: deeper into the decoder */
      memcpy(junk, "HOOP\x00\x03", 6);
    open_fds[nopen++] = send_raw(junk, len);
  }
  hoop__hello hello;
  memset(&hello, 0, sizeof hello);
  snprintf(hello.job, sizeof hello.job, "slow");
  hello.size = 2;
  hello.rank = -1;
  hello.timeout_ms = 60000;
  snprintf(hello.host, sizeof hello.host, "slowpoke");
  snprintf(hello.addr, sizeof hello.addr, "127.0.0.1:1");
  hoop__wbuf wb = {0};
  ck_assert_int_eq(hoop__wire_encode_hello(&wb, &hello), 0);
  int truncated = send_raw(wb.data, wb.len / 2);
  uint8_t huge[12] = {'H', 'O', 'O', 'P', 0, HOOP__WIRE_VERSION, 0, 1, 0x7f, 0xff, 0xff, 0xff};
  int oversized = send_raw(huge, sizeof huge);
  int deaf = send_raw(NULL, 0); /* never reads its challenge, never sends */
  int slow = send_raw(NULL, 0);
  size_t sent = 0;
  for (; sent < wb.len && sent < 40; sent++) {
    if (send(slow, wb.data + sent, 1, MSG_NOSIGNAL) != 1)
      break;
    sleep_ms(100);
  }
  ck_assert_msg(sent < wb.len, "the slow client sent its whole HELLO: the test is too short");
  hoop__wbuf_free(&wb);

  ck_assert_msg(closed_within(oversized, 5000), "a 2 GiB header: expected hoopd to close it");
  ck_assert_msg(closed_within(truncated, 5000), "a truncated HELLO: expected the idle timeout");
  ck_assert_msg(closed_within(slow, 5000),
                "a HELLO at one byte per 100 ms: expected the idle timeout to close it");
  ck_assert_msg(closed_within(deaf, 5000), "a silent client: expected the idle timeout");
  for (int i = 0; i < nopen; i++) {
    ck_assert_msg(closed_within(open_fds[i], 5000), "random bytes %d: expected hoopd to close", i);
    close(open_fds[i]);
  }
  close(oversized);
  close(truncated);
  close(slow);
  close(deaf);
  /* The job was not disturbed: its second rank completes it. */
  pid_t second = start_rank("zeta", 2, 1, NULL);
  ck_assert_int_eq(procs_wait(first, 120), 0);
  ck_assert_int_eq(procs_wait(second, 120), 0);
  ck_assert_msg(kill(hoopd_pid, 0) == 0, "hoopd died under hostile clients");
  stop_hoopd();
  expect_log_has(log, "job 'zeta' complete", "hoopd under hostile clients");
  unlink(log);
}
END_TEST

/* --idle-per-address 3: of six connections from 127.0.0.1 that say nothing, none is closed while
 * fresh; a second later, the next connection from there closes the oldest ones past the limit
 * (the four oldest: the two newest stay, the newcomer taking the third place) and the log names
 * the address; a job still joins. */
START_TEST(test_idle_per_address_option) {
  char log[] = "/tmp/hoop-idle-XXXXXX";
  start_hoopd_logging(log, "--idle-per-address", "3");
  int silent[6];
  for (int i = 0; i < 6; i++) {
    silent[i] = connect_hoopd();
    ck_assert_int_ge(silent[i], 0);
  }
  for (int i = 0; i < 6; i++)
    ck_assert_msg(!closed_within(silent[i], 100), "silent connection %d closed while fresh", i);
  sleep_ms(1200);
  int last = connect_hoopd();
  ck_assert_int_ge(last, 0);
  int closed = 0;
  for (int i = 0; i < 6; i++)
    closed += closed_within(silent[i], 2000);
  /* Newest first, the newcomer aside: silent[5] and silent[4] stay (2 of the 3 allowed, the
   * newcomer the third), silent[3] back to silent[0] go. */
  ck_assert_msg(closed == 4, "with --idle-per-address 3, %d of 6 silent connections closed, not 4",
                closed);
  for (int i = 0; i < 4; i++)
    ck_assert_msg(closed_within(silent[i], 100), "silent connection %d stayed open", i);
  pid_t a = start_rank("idle", 2, 0, NULL), b = start_rank("idle", 2, 1, NULL);
  ck_assert_int_eq(procs_wait(a, 60), 0);
  ck_assert_int_eq(procs_wait(b, 60), 0);
  for (int i = 0; i < 6; i++)
    close(silent[i]);
  close(last);
  stop_hoopd();
  expect_log_has(log, "from 127.0.0.1 had sent no request", "hoopd --idle-per-address 3");
  unlink(log);
}
END_TEST

/* hoopd --require-encrypt: a job whose ranks do not seal their connections is refused, saying
 * how to; the same job with HOOP_ENCRYPT=1 runs. */
START_TEST(test_require_encrypt) {
  char log[] = "/tmp/hoopd-sealed-XXXXXX";
  start_hoopd_logging(log, "--require-encrypt", NULL);
  char logs[2][32] = {"/tmp/hoop-clear-0-XXXXXX", "/tmp/hoop-clear-1-XXXXXX"};
  pid_t pids[2];
  for (int r = 0; r < 2; r++) {
    int fd = mkstemp(logs[r]);
    ck_assert_int_ge(fd, 0);
    close(fd);
    pids[r] = start_rank_with("clear", 2, r, logs[r], NULL);
  }
  for (int r = 0; r < 2; r++) {
    expect_failed_with(pids[r], logs[r], "admits only ranks that seal their data connections",
                       "a rank without HOOP_ENCRYPT at hoopd --require-encrypt");
    unlink(logs[r]);
  }
  pid_t a = start_rank_with("sealed", 2, 0, NULL, "HOOP_ENCRYPT=1");
  pid_t b = start_rank_with("sealed", 2, 1, NULL, "HOOP_ENCRYPT=1");
  ck_assert_msg(procs_wait(a, 120) == 0, "a sealed rank at hoopd --require-encrypt failed");
  ck_assert_msg(procs_wait(b, 120) == 0, "a sealed rank at hoopd --require-encrypt failed");
  stop_hoopd();
  unlink(log);
}
END_TEST

/* A 2-rank job through hoopd: how long it took to run, both ranks having succeeded. */
static double job_seconds(const char *job) {
  double start = procs_now();
  pid_t a = start_rank(job, 2, 0, NULL), b = start_rank(job, 2, 1, NULL);
  ck_assert_msg(procs_wait(a, 120) == 0, "job %s: rank 0 failed", job);
  ck_assert_msg(procs_wait(b, 120) == 0, "job %s: rank 1 failed", job);
  return procs_now() - start;
}

/* One address opens 4,096 silent connections to hoopd (its limit) within a second: it may hold a
 * quarter of them, its oldest closed as the newest come, so a job started at once still forms and
 * runs, where before the flood refused every rank for the idle timeout. Its time is printed beside
 * a job's before the flood (never asserted: this machine is shared). */
START_TEST(test_connection_flood_from_one_address) {
  enum { FLOOD = 4096 };
  struct rlimit own;
  ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &own), 0);
  if (own.rlim_cur != RLIM_INFINITY && own.rlim_cur < FLOOD + 256) {
    own.rlim_cur =
        own.rlim_max == RLIM_INFINITY || own.rlim_max >= FLOOD + 256 ? FLOOD + 256 : own.rlim_max;
    ck_assert_msg(setrlimit(RLIMIT_NOFILE, &own) == 0 && own.rlim_cur >= FLOOD + 256,
                  "this test needs %d open files, and the hard limit is %ld", FLOOD + 256,
                  (long)own.rlim_max);
  }
  char log[] = "/tmp/hoop-flood-XXXXXX";
  start_hoopd_logging(log, "--idle-timeout", "60");
  double normal = job_seconds("before-flood");
  static int fds[FLOOD];
  double start = procs_now();
  for (int i = 0; i < FLOOD; i++) {
    fds[i] = connect_hoopd();
    ck_assert_msg(fds[i] >= 0, "flood connection %d: %s", i, strerror(errno));
  }
  double opened = procs_now() - start;
  double flooded = job_seconds("under-flood");
  printf("4096 silent connections from 127.0.0.1 opened in %.2f s; a 2-rank job took %.2f s "
         "before them and %.2f s while they were held\n",
         opened, normal, flooded);
  int open = 0;
  for (int i = 0; i < FLOOD; i++) {
    open += still_open(fds[i]);
    close(fds[i]);
  }
  ck_assert_msg(open <= FLOOD / 4, "hoopd held %d of the %d silent connections of one address",
                open, FLOOD);
  stop_hoopd();
  expect_log_has(log, "its share of the server's 4096", "hoopd under a flood from one address");
  unlink(log);
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

/* ---- forged aborts --------------------------------------------------------------------------- */

#define FORGE_TOKEN "forge test token 51c2"

typedef struct forge_shared {
  atomic_int joined; /* ranks past their first barrier */
  atomic_int forged; /* the parent has sent its forgeries */
} forge_shared;

static forge_shared *forge;

static void wait_for(atomic_int *value, int at_least, double limit_s) {
  for (int waited = 0; atomic_load(value) < at_least && waited < limit_s * 100; waited++)
    sleep_ms(10);
}

/* A rank of job "forge" through hoopd with the token: a barrier, then an allreduce that rank 0
 * enters at once (watching its rendezvous connection) and rank 1 only after the forgeries. */
static int forge_rank(int index, int n, void *arg) {
  (void)arg;
  hoop_config config;
  hoop_config_init(&config);
  config.rendezvous = hoopd_addr;
  config.job = "forge";
  config.size = n;
  config.rank = index;
  config.timeout_s = 30;
  config.token = FORGE_TOKEN;
  hoop_comm *comm = NULL;
  hoop_result result = hoop_init(&comm, &config);
  if (result == HOOP_OK)
    result = hoop_barrier(comm);
  atomic_fetch_add(&forge->joined, 1);
  if (result == HOOP_OK && index == 1)
    wait_for(&forge->forged, 1, 20);
  float buf[64] = {0};
  if (result == HOOP_OK)
    result = hoop_allreduce(comm, buf, buf, 64, HOOP_FLOAT32, HOOP_SUM);
  if (result != HOOP_OK)
    fprintf(stderr,
            "rank %d of the job under forged aborts: expected every call to succeed, got "
            "%s: %s\n",
            index, hoop_strerror(result), hoop_last_error(comm));
  hoop_finalize(comm);
  return result != HOOP_OK;
}

/* The server's CHALLENGE, read off a new connection (up to 5 s). */
static int open_challenged(void) {
  int fd = connect_hoopd();
  ck_assert_msg(fd >= 0, "connecting to hoopd at %s: expected success, got %s", hoopd_addr,
                strerror(errno));
  struct timeval tv = {5, 0};
  ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
  uint8_t head[HOOP__WIRE_HEADER_SIZE + 1 + HOOP__WIRE_CHALLENGE];
  ck_assert_msg(recv(fd, head, sizeof head, MSG_WAITALL) == (ssize_t)sizeof head,
                "a new connection to hoopd: expected its %zu-byte CHALLENGE, got less",
                sizeof head);
  return fd;
}

static void send_forged_abort(int fd, uint32_t rank) {
  hoop__abort_msg msg = {.rank = rank};
  snprintf(msg.reason, sizeof msg.reason, "forged abort");
  hoop__wbuf out = {0};
  ck_assert_int_eq(hoop__wire_encode_abort(&out, &msg), 0);
  /* The daemon may already be closing the connection (after a failed proof): then the send fails,
   * which is as good. */
  if (send(fd, out.data, out.len, MSG_NOSIGNAL) < 0)
    ck_assert_msg(errno == EPIPE || errno == ECONNRESET,
                  "sending a forged ABORT: expected it sent or refused, got %s", strerror(errno));
  hoop__wbuf_free(&out);
}

/* hoopd with a token serves a 2-rank job; meanwhile a stranger sends ABORT without joining, and an
 * impostor sends one after a HELLO with a wrong proof. Each loses its connection at once, and the
 * job's calls all succeed: an ABORT is relayed only from an authenticated member. */
START_TEST(test_forged_abort_refused) {
  char token_file[64];
  write_file(token_file, FORGE_TOKEN "\n", 0600);
  start_hoopd_with(token_file);
  forge = mmap(NULL, sizeof *forge, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ck_assert_msg(forge != MAP_FAILED, "mmap: expected shared memory, got %s", strerror(errno));
  atomic_init(&forge->joined, 0);
  atomic_init(&forge->forged, 0);
  fflush(NULL);
  pid_t job = fork();
  ck_assert_int_ge(job, 0);
  if (job == 0)
    _exit(procs_fork_ranks(2, forge_rank, NULL, 60));
  wait_for(&forge->joined, 2, 30);
  ck_assert_msg(atomic_load(&forge->joined) == 2, "the job: expected both ranks joined, got %d",
                atomic_load(&forge->joined));

  int stranger = open_challenged();
  send_forged_abort(stranger, 0);
  int stranger_closed = closed_within(stranger, 5000);
  close(stranger);

  hoop__hello hello;
  memset(&hello, 0, sizeof hello);
  snprintf(hello.job, sizeof hello.job, "forge");
  snprintf(hello.host, sizeof hello.host, "impostor");
  snprintf(hello.addr, sizeof hello.addr, "127.0.0.1:1");
  hello.size = 2;
  hello.rank = 0;
  hello.timeout_ms = 5000;
  hello.proof_len = 32;
  memset(hello.proof, 0x5a, sizeof hello.proof);
  hoop__wbuf out = {0};
  ck_assert_int_eq(hoop__wire_encode_hello(&out, &hello), 0);
  int impostor = open_challenged();
  ck_assert_int_eq(send(impostor, out.data, out.len, MSG_NOSIGNAL), (ssize_t)out.len);
  hoop__wbuf_free(&out);
  send_forged_abort(impostor, 0);
  int impostor_closed = closed_within(impostor, 5000);
  close(impostor);
  atomic_store(&forge->forged, 1);

  int code = procs_wait(job, 60);
  munmap(forge, sizeof *forge);
  stop_hoopd();
  unlink(token_file);
  ck_assert_msg(stranger_closed, "a stranger's ABORT: expected hoopd to close its connection, it "
                                 "stayed open 5 s");
  ck_assert_msg(impostor_closed, "an impostor's ABORT after a wrong proof: expected hoopd to close "
                                 "its connection, it stayed open 5 s");
  ck_assert_msg(code == 0,
                "the job under forged aborts: expected both ranks to succeed, %d did "
                "not (exit %d; see above)",
                code, code);
}
END_TEST

/* The longest keepalive timer, in seconds, that `ss` shows on hoopd's side of its established
 * connections ("timer:(keepalive,1min59sec,0)"); -1 if none shows one. */
static double keepalive_timer_s(int port) {
  char command[160];
  snprintf(command, sizeof command, "ss -tnoH state established '( sport = :%d )' 2>/dev/null",
           port);
  FILE *ss = popen(command, "r");
  if (!ss)
    return -1;
  char line[1024];
  double longest = -1;
  while (fgets(line, sizeof line, ss)) {
    const char *at = strstr(line, "timer:(keepalive,");
    if (!at)
      continue;
    at += strlen("timer:(keepalive,");
    double seconds = 0, value;
    int used;
    while (sscanf(at, "%lf%n", &value, &used) == 1) {
      at += used;
      if (strncmp(at, "min", 3) == 0)
        seconds += value * 60, at += 3;
      else if (strncmp(at, "sec", 3) == 0)
        seconds += value, at += 3;
      else if (strncmp(at, "ms", 2) == 0)
        seconds += value / 1000, at += 2;
      else
        break;
    }
    if (seconds > longest)
      longest = seconds;
  }
  pclose(ss);
  return longest;
}

/* A rank that would wait longer than the daemon's keepalive (HOOP_TIMEOUT=600 against the default
 * 300) is not dropped sooner than it would give up itself: once it has joined, the daemon's side
 * of its connection probes after 600/5 = 120 s idle, not 300/5 = 60 s. */
START_TEST(test_keepalive_follows_rank_timeout) {
  start_hoopd();
  char rendezvous[128];
  snprintf(rendezvous, sizeof rendezvous, "HOOP_RENDEZVOUS=%s", hoopd_addr);
  char *env_add[] = {rendezvous,   "HOOP_JOB=eta", "HOOP_SIZE=2", "HOOP_TIMEOUT=600",
                     "HOOP_RANK=", "HOOP_TOKEN=",  NULL};
  char path[4096];
  snprintf(path, sizeof path, "%s", procs_build_path("tests/coll_worker"));
  char *argv[] = {path, "--quick", NULL};
  pid_t rank = procs_start(argv, env_add, NULL);
  ck_assert_int_gt(rank, 0);
  double timer = -1;
  for (int i = 0; i < 100 && timer <= 61; i++) { /* before its HELLO: the daemon's 60 s */
    sleep_ms(50);
    timer = keepalive_timer_s(hoopd_port);
  }
  kill(rank, SIGKILL);
  procs_wait(rank, 10);
  stop_hoopd();
  ck_assert_msg(timer > 90 && timer <= 120,
                "the keepalive timer on hoopd's side of a waiting rank's connection is %.1f s "
                "(-1: none seen), expected about 120 (HOOP_TIMEOUT=600 / 5)",
                timer);
}
END_TEST

static Suite *hoopd_suite(void) {
  Suite *s = suite_create("hoopd");
  TCase *tc = tcase_create("daemon");
  tcase_set_timeout(tc, 400);
  tcase_add_test(tc, test_two_jobs_at_once);
  tcase_add_test(tc, test_status_and_garbage);
  tcase_add_test(tc, test_version_and_help);
  tcase_add_test(tc, test_token_keeps_strangers_out);
  tcase_add_test(tc, test_token_needs_an_authenticating_server);
  tcase_add_test(tc, test_hostile_clients_during_a_job);
  tcase_add_test(tc, test_forged_abort_refused);
  tcase_add_test(tc, test_open_file_limit);
  tcase_add_test(tc, test_keepalive_follows_rank_timeout);
  tcase_add_test(tc, test_idle_per_address_option);
  tcase_add_test(tc, test_require_encrypt);
  tcase_add_test(tc, test_connection_flood_from_one_address);
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
