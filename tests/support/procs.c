/* procs.c - process helpers for the multi-process tests (see procs.h). */
#include "procs.h"

#include "hoop.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char *procs_build_path(const char *rel) {
  static char path[4096];
  const char *dir = getenv("HOOP_BUILDDIR");
  snprintf(path, sizeof path, "%s/%s", dir && dir[0] ? dir : ".", rel);
  return path;
}

pid_t procs_start(char *const argv[], char *const env_add[], const char *out_path) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid != 0)
    return pid;
  for (int i = 0; env_add && env_add[i]; i++)
    putenv(env_add[i]);
  if (out_path) {
    int fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
  }
  execvp(argv[0], argv);
  fprintf(stderr, "cannot start %s: %s\n", argv[0], strerror(errno));
  _exit(127);
}

static int status_code(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int procs_wait(pid_t pid, double timeout_s) {
  struct timespec pause = {0, 10 * 1000 * 1000};
  for (double waited = 0; waited < timeout_s; waited += 0.01) {
    int status;
    pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid)
      return status_code(status);
    if (done < 0)
      return -1;
    nanosleep(&pause, NULL);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

int procs_run(char *const argv[], char *const env_add[], const char *out_path, double timeout_s) {
  pid_t pid = procs_start(argv, env_add, out_path);
  return pid < 0 ? -1 : procs_wait(pid, timeout_s);
}

int procs_fork_ranks(int n, int (*fn)(int index, int n, void *arg), void *arg, double timeout_s) {
  pid_t pids[256];
  int bad = 0;
  fflush(NULL);
  for (int i = 0; i < n && i < 256; i++) {
    pids[i] = fork();
    if (pids[i] == 0)
      _exit(fn(i, n, arg));
  }
  for (int i = 0; i < n && i < 256; i++) {
    int code = pids[i] < 0 ? -1 : procs_wait(pids[i], timeout_s);
    if (code != 0) {
      fprintf(stderr, "forked rank %d ended with %d (expected 0; -1 means killed at timeout)\n", i,
              code);
      bad++;
    }
  }
  return bad;
}

void procs_local_config(struct hoop_config *config, char *rendezvous, size_t len, int port,
                        int index, int n) {
  snprintf(rendezvous, len, "127.0.0.1:%d", port);
  hoop_config_init(config);
  config->rendezvous = rendezvous;
  config->size = n;
  config->rank = index;
  config->serve_rendezvous = index == 0;
  /* HOOP_TEST_TRANSPORT runs a suite's forked jobs over one transport (tests/test_failures_tcp.sh):
   * a config's transport wins over HOOP_TRANSPORT. */
  const char *transport = getenv("HOOP_TEST_TRANSPORT");
  if (transport && transport[0])
    config->transport = transport;
}

hoop_comm *procs_join(int port, int index, int n, double timeout_s, const char *transport) {
  char rendezvous[64];
  hoop_config config;
  procs_local_config(&config, rendezvous, sizeof rendezvous, port, index, n);
  config.timeout_s = timeout_s;
  if (transport)
    config.transport = transport;
  hoop_comm *comm = NULL;
  if (hoop_init(&comm, &config) != HOOP_OK) {
    fprintf(stderr, "rank %d: hoop_init: %s\n", index, hoop_last_error(comm));
    hoop_finalize(comm);
    return NULL;
  }
  return comm;
}

/* Whether port may be bound on 127.0.0.1 now (as the servers bind: SO_REUSEADDR). */
static int port_bindable(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), on = 1;
  struct sockaddr_in addr = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  int ok = fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) == 0 &&
           bind(fd, (struct sockaddr *)&addr, sizeof addr) == 0;
  if (fd >= 0)
    close(fd);
  return ok;
}

int procs_free_port(void) {
  enum { SPAN = 12000 };
  static const char dir[] = "/tmp/hoop-test-ports";
  static unsigned tries;
  int low = 32768;
  char *range = procs_slurp("/proc/sys/net/ipv4/ip_local_port_range");
  if (range && atoi(range) > 0)
    low = atoi(range);
  free(range);
  int first = low - SPAN > 1024 ? low - SPAN : 1024;
  if (mkdir(dir, 01777) == 0)
    chmod(dir, 01777); /* every user's tests share it */
  for (int i = 0; i < 4000; i++) {
    int port =
        first + (int)(((unsigned)getpid() * 7919u + tries++ * 131u) % (unsigned)(low - first));
    char path[64];
    snprintf(path, sizeof path, "%s/%d", dir, port);
    int fd = open(path, O_RDONLY | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0)
      continue;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0 && port_bindable(port))
      return port; /* fd stays open: the lock lasts as long as this process */
    close(fd);
  }
  return -1;
}

char *procs_slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  size_t cap = 4096, len = 0;
  char *text = malloc(cap);
  size_t n;
  while (text && (n = fread(text + len, 1, cap - len - 1, f)) > 0) {
    len += n;
    if (cap - len < 2) {
      char *grown = realloc(text, cap * 2);
      if (!grown) {
        free(text);
        text = NULL;
        break;
      }
      text = grown;
      cap *= 2;
    }
  }
  fclose(f);
  if (text)
    text[len] = '\0';
  return text;
}

int procs_hooprun(int np, char *const env_add[], const char *rel, const char *arg1,
                  const char *arg2, char **out) {
  char np_text[16], hooprun[4096], worker[4096];
  snprintf(np_text, sizeof np_text, "%d", np);
  snprintf(hooprun, sizeof hooprun, "%s", procs_build_path("tools/hooprun"));
  snprintf(worker, sizeof worker, "%s", procs_build_path(rel));
  char path[] = "/tmp/hoop-worker-XXXXXX";
  *out = NULL;
  int fd = mkstemp(path);
  if (fd < 0)
    return -1;
  close(fd);
  char *argv[] = {hooprun, "-np",        np_text,      "--timeout", "10",
                  worker,  (char *)arg1, (char *)arg2, NULL};
  if (!arg1)
    argv[6] = NULL;
  int code = procs_run(argv, env_add, path, 300);
  *out = procs_slurp(path);
  unlink(path);
  return code;
}

int procs_count(const char *text, const char *needle) {
  int n = 0;
  for (const char *at = text; (at = strstr(at, needle)) != NULL; at += strlen(needle))
    n++;
  return n;
}

double procs_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
