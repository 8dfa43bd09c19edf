/* rdzv-load - a rendezvous under the load of a large job (issue 39): N ranks' worth of rendezvous
 * clients, all in this one process (non-blocking sockets on one epoll set, no data connections),
 * join one job at a rendezvous server, as the ranks of N processes would: each connects, reads the
 * server's CHALLENGE, sends its HELLO (with the token's proof when the server asks for one),
 * reads its TABLE (and TABLE_PROOF), and keeps its connection, as members do, until every client
 * holds its table; then each says BYE and closes. The server is a hoopd (--hoopd PATH, started
 * here) or the one a rank hosts (--embedded: a child process running the rendezvous thread that
 * rank 0 starts, with the same options). Prints, per round: the time until every client is
 * connected and until every client holds its table (and the p50 and p99 of the clients' own join
 * times), the server's resident memory and descriptors before, with every member connected, and
 * after the job (a hoopd serves every round, so that its memory after each job shows whether it
 * is back where it was); the tables are checked (size, rank, every entry) on a sample of
 * clients.
 *
 * --stats S (issue 55): before they leave, the members send S seconds of health summaries as ranks
 * do (a STATS of 64 calls every 2 s, at the same moments of the wall clock, each taking the VIEW
 * that answers it), and a line says how much of a core the server used for them, and how many
 * bytes per second each rank sent.
 *
 * usage: rdzv-load [-n RANKS] [-H HOSTS] [-r ROUNDS] [--token-file FILE] [--server-log FILE]
 *                  [--stats S] (--hoopd PATH | --embedded) (--server-log: hoopd's standard error)
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proto/auth.h"
#include "proto/wire.h"
#include "rdzv/server.h"
#include "util/buf.h"

enum phase { CONNECTING, CHALLENGE, TABLE, TABLE_PROOF, HOLDING, FAILED };

typedef struct client {
  int fd;
  int rank;
  enum phase phase;
  uint8_t *in; /* what has come in of the message being read */
  size_t got, want, cap;
  double started, joined;
  uint8_t nonce[HOOP__WIRE_CHALLENGE];
} client;

typedef struct load {
  int n, hosts, rounds;
  const char *hoopd, *token_file, *server_log;
  char token[HOOP__MAX_TOKEN + 1];
  int embedded;
  int port;
  pid_t server;
  char job[64];
  int ep;
  client *clients;
  int connected, holding, failed;
  double stats_s; /* --stats: seconds of summaries before the members leave (0: none) */
} load;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The server process (hoopd, or the fork hosting the embedded server), which die() stops: a
 * failed run leaves no server behind. */
static pid_t server_pid;

static void die(const char *what) {
  fprintf(stderr, "rdzv-load: %s\n", what);
  if (server_pid > 0) {
    kill(server_pid, SIGKILL);
    waitpid(server_pid, NULL, 0);
  }
  exit(2);
}

/* The server's resident memory (kB) and open descriptors. */
static void server_usage(pid_t pid, long *rss_kb, long *fds) {
  char path[64], line[256];
  *rss_kb = *fds = -1;
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "re");
  if (f) {
    while (fgets(line, sizeof line, f))
      if (strncmp(line, "VmRSS:", 6) == 0)
        *rss_kb = strtol(line + 6, NULL, 10);
    fclose(f);
  }
  snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
  DIR *dir = opendir(path);
  if (dir) {
    long count = 0;
    for (struct dirent *entry; (entry = readdir(dir)) != NULL;)
      if (entry->d_name[0] != '.')
        count++;
    closedir(dir);
    *fds = count;
  }
}

/* The server's descriptors once they stop changing (its loop may still be closing what a client
 * just closed), waiting at most limit_s. */
static void server_settled(pid_t pid, long *rss_kb, long *fds, double limit_s) {
  long last_fds = -2, rss;
  double until = now() + limit_s;
  for (;;) {
    server_usage(pid, &rss, fds);
    if (*fds == last_fds || now() > until)
      break;
    last_fds = *fds;
    usleep(100000);
  }
  *rss_kb = rss;
}

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
      getsockname(fd, (struct sockaddr *)&a, &len) != 0)
    die("cannot find a free port");
  close(fd);
  return ntohs(a.sin_port);
}

/* The embedded server, as rank 0 starts it (lib/comm/comm.c): one job, its id and size, on its
 * own thread; the child waits until told to stop. */
static void run_embedded(const load *l, int stop_fd) {
  char listen[64], err[256];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", l->port);
  hoop__rdzv_options options = {0};
  options.listen = listen;
  options.once = 1;
  options.max_connections = l->n + 64;
  options.max_idle_per_address = l->n > 64 ? l->n : 0;
  options.only_job = l->job;
  options.only_size = (unsigned)l->n;
  options.only_timeout_ms = 120000;
  options.token = l->token[0] ? l->token : NULL;
  long hard;
  hoop__raise_open_files(l->n + 128, &hard);
  hoop__rdzv_thread *thread;
  if (hoop__rdzv_thread_start(&options, &thread, err, sizeof err) != 0) {
    fprintf(stderr, "rdzv-load: the embedded server: %s\n", err);
    _exit(2);
  }
  char byte;
  while (read(stop_fd, &byte, 1) < 0 && errno == EINTR)
    ;
  hoop__rdzv_thread_stop(thread);
  _exit(0);
}

static int stop_pipe[2] = {-1, -1};

static void start_server(load *l) {
  l->port = free_port();
  if (l->embedded) {
    if (pipe(stop_pipe) != 0)
      die("pipe");
    l->server = fork();
    if (l->server < 0)
      die("fork");
    if (l->server == 0) {
      close(stop_pipe[1]);
      run_embedded(l, stop_pipe[0]);
    }
    close(stop_pipe[0]);
  } else {
    char listen[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", l->port);
    l->server = fork();
    if (l->server < 0)
      die("fork");
    if (l->server == 0) {
      int log = l->server_log ? open(l->server_log, O_WRONLY | O_CREAT | O_TRUNC, 0644)
                              : open("/dev/null", O_WRONLY);
      dup2(log, 2);
      if (l->token_file)
        execl(l->hoopd, l->hoopd, "--listen", listen, "--token-file", l->token_file, (char *)NULL);
      else
        execl(l->hoopd, l->hoopd, "--listen", listen, (char *)NULL);
      _exit(127);
    }
  }
  server_pid = l->server;
  for (int i = 0; i < 500; i++) { /* until it listens */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)l->port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    if (ok)
      return;
    usleep(10000);
  }
  die("the server did not listen within 5 s");
}

static void stop_server(load *l) {
  if (l->embedded) {
    if (write(stop_pipe[1], "x", 1) < 0)
      perror("rdzv-load: stopping the embedded server");
    close(stop_pipe[1]);
  } else {
    kill(l->server, SIGTERM);
  }
  waitpid(l->server, NULL, 0);
  server_pid = 0;
}

static void expect(client *c, size_t bytes) {
  if (bytes > c->cap) {
    uint8_t *grown = realloc(c->in, bytes);
    if (!grown)
      die("out of memory");
    c->in = grown;
    c->cap = bytes;
  }
  c->want = bytes;
}

static void fail(load *l, client *c, const char *why) {
  if (l->failed++ < 5)
    fprintf(stderr, "rdzv-load: client %d: %s\n", c->rank, why);
  c->phase = FAILED;
  epoll_ctl(l->ep, EPOLL_CTL_DEL, c->fd, NULL);
}

static void send_hello(load *l, client *c, const hoop__challenge *challenge) {
  hoop__hello hello = {0};
  snprintf(hello.job, sizeof hello.job, "%s", l->job);
  hello.size = (uint32_t)l->n;
  hello.rank = c->rank;
  hello.timeout_ms = 120000;
  snprintf(hello.host, sizeof hello.host, "sim-host-%d", c->rank % l->hosts);
  snprintf(hello.addr, sizeof hello.addr, "10.%d.%d.%d:%d", (c->rank >> 16) & 255,
           (c->rank >> 8) & 255, c->rank & 255, 20000 + c->rank % 1000);
  hoop__auth_random(c->nonce, sizeof c->nonce);
  memcpy(hello.nonce, c->nonce, sizeof c->nonce);
  if (challenge->flags & HOOP__CHALLENGE_AUTH) {
    if (!l->token[0]) {
      fail(l, c, "the server asks for a token: --token-file");
      return;
    }
    hello.proof_len = HOOP__AUTH_PROOF;
    if (hoop__auth_hello_proof(l->token, challenge->nonce, &hello, hello.proof) != 0)
      die("out of memory");
  }
  hoop__wbuf wb = {0};
  if (hoop__wire_encode_hello(&wb, &hello) != 0 ||
      send(c->fd, wb.data, wb.len, MSG_NOSIGNAL) != (ssize_t)wb.len)
    fail(l, c, "sending its HELLO");
  hoop__wbuf_free(&wb);
}

/* Whether this client's table is right: its size, its rank, every rank's address. */
static int table_ok(const load *l, const client *c, const uint8_t *payload, size_t len) {
  hoop__table table;
  if (hoop__wire_decode_table(payload, len, &table) != 0)
    return 0;
  int ok = table.size == (uint32_t)l->n && table.rank < table.size;
  for (uint32_t i = 0; ok && i < table.size; i++)
    ok = strncmp(table.peers[i].host, "sim-host-", 9) == 0 &&
         strncmp(table.peers[i].addr, "10.", 3) == 0;
  hoop__table_free(&table);
  (void)c;
  return ok;
}

/* A whole message has come in: act on it. */
static void on_message(load *l, client *c, int *checked) {
  hoop__wire_header h;
  if (hoop__wire_decode_header(c->in, HOOP__WIRE_HEADER_SIZE, HOOP__WIRE_MAX_PAYLOAD, &h) != 0) {
    fail(l, c, "a malformed header");
    return;
  }
  const uint8_t *payload = c->in + HOOP__WIRE_HEADER_SIZE;
  if (h.type == HOOP_MSG_ERROR) {
    hoop__error_msg e;
    fail(l, c, hoop__wire_decode_error(payload, h.length, &e) == 0 ? e.message : "an ERROR");
    return;
  }
  if (c->phase == CHALLENGE) {
    hoop__challenge challenge;
    if (h.type != HOOP_MSG_CHALLENGE || hoop__wire_decode_challenge(payload, h.length, &challenge))
      fail(l, c, "no CHALLENGE first");
    else {
      c->phase = TABLE;
      send_hello(l, c, &challenge);
    }
  } else if (c->phase == TABLE) {
    if (h.type != HOOP_MSG_TABLE) {
      fail(l, c, "no TABLE");
      return;
    }
    /* A sample is decoded in full: the first, the last, and every 97th. */
    if ((c->rank == 0 || c->rank == l->n - 1 || c->rank % 97 == 0)) {
      if (!table_ok(l, c, payload, h.length)) {
        fail(l, c, "a wrong TABLE");
        return;
      }
      (*checked)++;
    }
    c->phase = l->token[0] ? TABLE_PROOF : HOLDING;
  } else if (c->phase == TABLE_PROOF) {
    if (h.type != HOOP_MSG_TABLE_PROOF) {
      fail(l, c, "no TABLE_PROOF");
      return;
    }
    c->phase = HOLDING;
  }
  if (c->phase == HOLDING) {
    c->joined = now();
    l->holding++;
  }
}

/* Read what is there; a message is the header, then its payload. */
static void on_readable(load *l, client *c, int *checked) {
  for (;;) {
    if (c->want == 0)
      expect(c, HOOP__WIRE_HEADER_SIZE);
    ssize_t n = recv(c->fd, c->in + c->got, c->want - c->got, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
      return;
    if (n <= 0) {
      fail(l, c, n == 0 ? "the server closed the connection" : strerror(errno));
      return;
    }
    c->got += (size_t)n;
    if (c->got < c->want)
      continue;
    if (c->want == HOOP__WIRE_HEADER_SIZE) {
      hoop__wire_header h;
      if (hoop__wire_decode_header(c->in, c->got, HOOP__WIRE_MAX_PAYLOAD, &h) != 0) {
        fail(l, c, "a malformed header");
        return;
      }
      if (h.length > 0) {
        expect(c, HOOP__WIRE_HEADER_SIZE + h.length);
        continue;
      }
    }
    on_message(l, c, checked);
    c->got = c->want = 0;
    if (c->phase == HOLDING || c->phase == FAILED)
      return;
  }
}

/* The server's CPU time so far (user and system), in seconds. */
static double server_cpu(pid_t pid) {
  char path[64], text[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "re");
  if (!f)
    return 0;
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  const char *p = strrchr(text, ')'); /* after the command's name, which may hold spaces */
  unsigned long utime = 0, stime = 0;
  if (p)
    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime);
  return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

/* The members' summaries for stats_s seconds: every 2 s each sends a STATS of 64 calls (the same
 * calls, as the ranks of one job describe), and drains the VIEWs that answer. */
static void summaries(load *l) {
  hoop__stats_msg msg = {.calls = 1000, .bytes = 1 << 20, .since_us = 10000000};
  double cpu0 = server_cpu(l->server), start = now(), next = start;
  uint64_t sent = 0, round = 0;
  struct epoll_event events[256];
  uint8_t drain[4096];
  while (now() - start < l->stats_s) {
    if (now() >= next) {
      next += 2.0;
      round++;
      for (int i = 0; i < l->n; i++) {
        client *c = &l->clients[i];
        if (c->phase != HOLDING)
          continue;
        msg.nsamples = HOOP__WIRE_STATS_SAMPLES;
        msg.waited_us = msg.in_calls_us = 0;
        for (uint32_t k = 0; k < msg.nsamples; k++) {
          msg.samples[k].seq = (uint32_t)(round * 64 + k + 1);
          msg.samples[k].waited_us = (uint32_t)(100 + (c->rank * 7 + k) % 50);
          msg.waited_us += msg.samples[k].waited_us;
        }
        msg.in_calls_us = msg.waited_us;
        hoop__wbuf out = {0};
        if (hoop__wire_encode_stats(&out, &msg) == 0 &&
            send(c->fd, out.data, out.len, MSG_NOSIGNAL) == (ssize_t)out.len)
          sent += out.len;
        hoop__wbuf_free(&out);
      }
    }
    int ready = epoll_wait(l->ep, events, 256, 50);
    for (int e = 0; e < ready; e++) {
      client *c = events[e].data.ptr;
      while (c->phase == HOLDING && recv(c->fd, drain, sizeof drain, MSG_DONTWAIT) > 0)
        ;
    }
  }
  double elapsed = now() - start, cpu = server_cpu(l->server) - cpu0;
  printf("summaries: %d ranks, a STATS every 2 s for %.0f s: the server used %.1f%% of a core; "
         "%.0f bytes/s per rank\n",
         l->holding, elapsed, 100 * cpu / elapsed,
         (double)sent / elapsed / (l->holding ? l->holding : 1));
}

static int by_time(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void round_of(load *l, int round) {
  snprintf(l->job, sizeof l->job, "load-%d-%d", (int)getpid(), round);
  if (l->embedded || round == 0) /* a hoopd serves every round: is its memory back each time? */
    start_server(l);
  long rss0, fds0, rss1, fds1, rss2, fds2;
  server_settled(l->server, &rss0, &fds0, 2.0);
  l->connected = l->holding = l->failed = 0;
  l->ep = epoll_create1(EPOLL_CLOEXEC);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)l->port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  double start = now(), all_connected = 0;
  for (int i = 0; i < l->n; i++) {
    client *c = &l->clients[i];
    memset(c, 0, sizeof *c);
    c->rank = i;
    c->started = now();
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
      die("socket: too few descriptors? (ulimit -n)");
    /* Each simulated host's clients come from an address of its own (127.1.0.0/16 is loopback
     * too), as a job's hosts do: the server's limit of silent connections per address counts
     * per host, not all clients as one. */
    int h = (int)((long)i * l->hosts / l->n);
    struct sockaddr_in from = {.sin_family = AF_INET,
                               .sin_addr.s_addr = htonl(0x7f010000u | (uint32_t)(h + 1))};
    if (bind(c->fd, (struct sockaddr *)&from, sizeof from) != 0)
      die("bind to a client address of 127.1.0.0/16");
    int rc = connect(c->fd, (struct sockaddr *)&a, sizeof a);
    c->phase = rc == 0 ? CHALLENGE : CONNECTING;
    if (rc != 0 && errno != EINPROGRESS)
      die("connect");
    if (rc == 0)
      l->connected++;
    struct epoll_event ev = {.events = rc == 0 ? EPOLLIN : EPOLLIN | EPOLLOUT, .data.ptr = c};
    epoll_ctl(l->ep, EPOLL_CTL_ADD, c->fd, &ev);
  }
  int checked = 0;
  struct epoll_event events[256];
  while (l->holding + l->failed < l->n && now() - start < 120) {
    int ready = epoll_wait(l->ep, events, 256, 1000);
    for (int e = 0; e < ready; e++) {
      client *c = events[e].data.ptr;
      if (c->phase == CONNECTING) {
        if (!(events[e].events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
          continue;
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) {
          fail(l, c, strerror(err));
          continue;
        }
        c->phase = CHALLENGE;
        l->connected++;
        struct epoll_event in = {.events = EPOLLIN, .data.ptr = c};
        epoll_ctl(l->ep, EPOLL_CTL_MOD, c->fd, &in);
      }
      if ((c->phase == CHALLENGE || c->phase == TABLE || c->phase == TABLE_PROOF) &&
          (events[e].events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
        on_readable(l, c, &checked);
      if (l->connected == l->n && all_connected == 0)
        all_connected = now();
    }
  }
  double all_joined = now();
  server_usage(l->server, &rss1, &fds1);
  double *joins = malloc((size_t)l->n * sizeof *joins);
  int njoins = 0;
  for (int i = 0; i < l->n; i++)
    if (l->clients[i].phase == HOLDING)
      joins[njoins++] = l->clients[i].joined - l->clients[i].started;
  qsort(joins, (size_t)njoins, sizeof *joins, by_time);
  if (l->stats_s > 0)
    summaries(l);
  /* The members say BYE and leave, as ranks finalizing do. */
  hoop__wbuf bye = {0};
  hoop__wire_encode_bye(&bye);
  for (int i = 0; i < l->n; i++) {
    client *c = &l->clients[i];
    if (c->phase == HOLDING && send(c->fd, bye.data, bye.len, MSG_NOSIGNAL) < 0)
      perror("rdzv-load: BYE");
    close(c->fd);
    free(c->in);
  }
  hoop__wbuf_free(&bye);
  close(l->ep);
  usleep(200000);
  server_settled(l->server, &rss2, &fds2, 5.0);
  if (l->embedded || round == l->rounds - 1)
    stop_server(l);
  printf("%-8s %6d %5d %9.3f %9.3f %8.2f %8.2f %9ld %9ld %9ld %6ld %6ld %6ld %5d %4d %5d\n",
         l->embedded ? "embedded" : "hoopd", l->n, l->hosts,
         all_connected > 0 ? all_connected - start : -1.0, all_joined - start,
         njoins ? joins[njoins / 2] * 1e3 : -1.0,
         njoins ? joins[(size_t)((njoins - 1) * 0.99)] * 1e3 : -1.0, rss0, rss1, rss2, fds0, fds1,
         fds2, checked, l->failed, njoins);
  fflush(stdout);
  free(joins);
}

int main(int argc, char **argv) {
  load l = {.n = 1024, .hosts = 128, .rounds = 3};
  static const struct option options[] = {
      {"hoopd", required_argument, NULL, 'd'},      {"embedded", no_argument, NULL, 'e'},
      {"token-file", required_argument, NULL, 't'}, {"server-log", required_argument, NULL, 'l'},
      {"stats", required_argument, NULL, 's'},      {NULL, 0, NULL, 0}};
  int opt;
  while ((opt = getopt_long(argc, argv, "n:H:r:", options, NULL)) != -1) {
    switch (opt) {
    case 'n': l.n = atoi(optarg); break;
    case 'H': l.hosts = atoi(optarg); break;
    case 'r': l.rounds = atoi(optarg); break;
    case 'd': l.hoopd = optarg; break;
    case 'e': l.embedded = 1; break;
    case 't': l.token_file = optarg; break;
    case 'l': l.server_log = optarg; break;
    case 's': l.stats_s = atof(optarg); break;
    default:
      die("usage: rdzv-load [-n RANKS] [-H HOSTS] [-r ROUNDS] [--token-file FILE] "
          "(--hoopd PATH | --embedded)");
    }
  }
  if ((!l.hoopd) == (!l.embedded) || l.n < 1 || l.n > HOOP__WIRE_MAX_RANKS || l.hosts < 1)
    die("usage: rdzv-load [-n RANKS] [-H HOSTS] [-r ROUNDS] [--token-file FILE] "
        "(--hoopd PATH | --embedded)");
  if (l.hosts > l.n)
    l.hosts = l.n;
  char err[256];
  if (l.token_file && hoop__auth_read_token(l.token_file, l.token, sizeof l.token, err, sizeof err))
    die(err);
  long hard;
  if (hoop__raise_open_files(l.n + 256, &hard) < l.n + 256)
    die("cannot open enough descriptors for the clients (ulimit -Hn)");
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0); /* lines in order with what goes to stderr */
  l.clients = calloc((size_t)l.n, sizeof *l.clients);
  printf("%-8s %6s %5s %9s %9s %8s %8s %9s %9s %9s %6s %6s %6s %5s %4s %5s\n", "server", "ranks",
         "hosts", "conn s", "tables s", "p50 ms", "p99 ms", "rss0 kB", "rss kB", "rss1 kB", "fds0",
         "fds", "fds1", "chk", "fail", "held");
  for (int r = 0; r < l.rounds; r++)
    round_of(&l, r);
  free(l.clients);
  return 0;
}
