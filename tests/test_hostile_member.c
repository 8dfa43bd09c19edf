/* test_hostile_member.c - a member of a running job cannot harm a peer through the shared-memory
 * transport (issue 37), nor stand in for another member (issue 56). Rank 0 of a real 4-rank job,
 * which knows the job's data key, opens its own connections to rank 2 before the pair 0-2 is
 * connected (ring neighbours connect at init; 0 and 2 are not) and presents hellos with valid
 * proofs but segments it could cut later, or for another member's place; and to rank 3, a hello in
 * rank 1's place on the pair 1-3, not connected yet, proven with the job's key and rank 0's own key
 * pair, over shared memory and over TCP. Each must be refused, logged at HOOP_DEBUG=info with what
 * it received closed; the job then completes with results checked against their closed forms. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "hoop.h"
#include "proto/auth.h"
#include "shm/shm.h"
#include "support/procs.h"
#include "transport/transport.h"
#include "util/be.h"
#include "util/sockio.h"

#define RANKS 4
#define HOSTILE 0
#define VICTIM 2
#define JOB_TIMEOUT_S 30.0
/* How long the hostile member waits for rank 2 to take or refuse its unsealed segment. */
#define VERDICT_WAIT_S 60.0
/* The connecting rank's hello, as transports/shm/conn.c's connect_peer writes it: {magic,
 * version, from, to, proof, probe address, probe value}. */
#define HELLO_BYTES (16 + HOOP__WIRE_NONCE + 16)
#define REFUSAL                                                                                    \
  "refused a connection that did not present this job's handshake (from pid %ld: not this job's "  \
  "hello, or a segment not sealed against shrinking)"

/* What the forked ranks share: the victim says when it has counted its descriptors, and the
 * hostile member waits for that before its first hello. */
typedef struct member_job {
  int port;
  char dir[64];
  atomic_int victim_counted;
  atomic_int attack_sent; /* rank 1 connects to rank 3 only after the forged hello is queued */
  atomic_long hostile_pid;
} member_job;

/* One hostile hello: who it claims to come from and go to, the pair its proof is for, and its
 * segment's size and seals. */
typedef struct hostile_hello {
  const char *what;
  uint32_t from, to;             /* as written in the hello */
  uint32_t proof_from, proof_to; /* the pair whose proof it carries */
  size_t bytes;
  int seals;
  int target; /* the rank whose listener it goes to */
} hostile_hello;

#define ALL_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
static const hostile_hello hellos[] = {
    {"an unsealed segment, cut to 0 bytes once rank 2 decides", 0, 2, 0, 2, sizeof(shm_segment), 0,
     VICTIM},
    {"a segment sealed against shrinking but open to further seals", 0, 2, 0, 2,
     sizeof(shm_segment), F_SEAL_SHRINK | F_SEAL_GROW, VICTIM},
    {"a sealed segment of one page", 0, 2, 0, 2, 4096, ALL_SEALS, VICTIM},
    {"a hello for rank 1, with rank 0's proof for rank 1", 0, 1, 0, 1, sizeof(shm_segment),
     ALL_SEALS, VICTIM},
    {"rank 1's hello, in the place rank 1 took at init", 1, 2, 1, 2, sizeof(shm_segment), ALL_SEALS,
     VICTIM},
    {"rank 3's hello (a higher rank never connects to a lower)", 3, 2, 3, 2, sizeof(shm_segment),
     ALL_SEALS, VICTIM},
    /* A member in another's place on a pair not connected yet (the ring of hoop_init joins 0-1,
     * 1-2, 2-3 and 3-0): with one key per job this proof was right, and rank 3 would have taken
     * rank 0's segment for rank 1's, refusing rank 1 later. Now the proof wants the pair's key. */
    {"rank 1's hello to rank 3 (pair 1-3, not connected yet), proven with rank 0's own keys", 1, 3,
     1, 3, sizeof(shm_segment), ALL_SEALS, 3},
};
#define IMPERSONATED 1 /* hellos aimed at rank 3, the last of the list */
#define HELLOS (sizeof hellos / sizeof hellos[0])

/* The hostile member's side of its connections: each socket, and the unsealed segment it keeps
 * to cut. */
typedef struct attack {
  int socks[HELLOS];
  int unsealed; /* hellos[0]'s memfd */
  int taken;    /* rank 2 answered hellos[0]: it mapped the segment */
  pthread_t cutter;
  int cutter_running;
} attack;

static int open_fds(void) {
  DIR *dir = opendir("/proc/self/fd");
  if (!dir)
    return -1;
  int n = 0;
  while (readdir(dir))
    n++;
  closedir(dir);
  return n;
}

static void nap(double seconds) {
  struct timespec pause = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
  nanosleep(&pause, NULL);
}

/* A segment as the hello would bring it: a memfd of bytes with the segment's magic and version at
 * its start, then seals. -1 with a message on stderr. */
static int make_segment(const hostile_hello *hello) {
  int memfd = memfd_create("hoop-hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  uint32_t magic = SHM_MAGIC, version = SHM_VERSION;
  if (memfd < 0 || ftruncate(memfd, (off_t)hello->bytes) != 0 ||
      pwrite(memfd, &magic, sizeof magic, offsetof(shm_segment, magic)) != (ssize_t)sizeof magic ||
      pwrite(memfd, &version, sizeof version, offsetof(shm_segment, version)) !=
          (ssize_t)sizeof version ||
      (hello->seals && fcntl(memfd, F_ADD_SEALS, hello->seals) != 0)) {
    fprintf(stderr, "hostile: a segment for '%s': %s\n", hello->what, strerror(errno));
    if (memfd >= 0)
      close(memfd);
    return -1;
  }
  return memfd;
}

/* Connect to rank 2's shared-memory listener, named by its entry in the rank table ("KEY/NAME"),
 * and send hello with its segment. The socket, or -1. */
static int send_hello(const hoop__tctx *shm, const hostile_hello *hello, int memfd) {
  int target = hello->target;
  const char *name = strrchr(shm->table->peers[target].addr, '/');
  if (!name || !name[1]) {
    fprintf(stderr, "hostile: rank %d's entry '%s' names no listener\n", target,
            shm->table->peers[target].addr);
    return -1;
  }
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  size_t len = strlen(name + 1);
  if (len > sizeof addr.sun_path - 1)
    len = sizeof addr.sun_path - 1;
  memcpy(addr.sun_path + 1, name + 1, len);
  uint8_t bytes[HELLO_BYTES];
  hoop__put_be32(bytes, SHM_MAGIC);
  hoop__put_be32(bytes + 4, SHM_VERSION);
  hoop__put_be32(bytes + 8, hello->from);
  hoop__put_be32(bytes + 12, hello->to);
  /* The best a member can do for another's place: the proof of that place, made with its own key
   * pair (and the job's key, which every member holds). */
  hoop__keyring ring = {0};
  hoop__tctx as_other = *shm;
  as_other.keyring = &ring;
  if (hello->proof_from != (uint32_t)shm->rank && hello->proof_to != (uint32_t)shm->rank)
    as_other.rank = (int)hello->proof_from;
  hoop__link_proof(&as_other, "shm", hello->proof_from, hello->proof_to, 0, bytes + 16);
  hoop__keyring_free(&ring);
  hoop__put_be64(bytes + 16 + HOOP__WIRE_NONCE, 0);
  hoop__put_be64(bytes + 24 + HOOP__WIRE_NONCE, 0);
  int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0 ||
      connect(sock, (struct sockaddr *)&addr,
              (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len)) != 0 ||
      hoop__send_with_fd(sock, bytes, sizeof bytes, memfd) != (ssize_t)sizeof bytes) {
    fprintf(stderr, "hostile: sending '%s' to rank 2: %s\n", hello->what, strerror(errno));
    if (sock >= 0)
      close(sock);
    return -1;
  }
  return sock;
}

/* What rank 2 did with a hello: 0 closed the connection (refused), 1 answered (took it), -1 said
 * nothing within wait_s. */
static int verdict(int sock, double wait_s) {
  struct pollfd pfd = {.fd = sock, .events = POLLIN};
  if (poll(&pfd, 1, (int)(wait_s * 1000)) <= 0)
    return -1;
  char byte;
  ssize_t n = recv(sock, &byte, 1, MSG_DONTWAIT);
  return n > 0 ? 1 : n == 0 || errno == ECONNRESET ? 0 : -1;
}

/* The hostile member's thread: as soon as rank 2 has decided on the unsealed segment, cut it to 0
 * bytes, as a member would to have rank 2 fault (SIGBUS) in its mapping. */
static void *cut_when_decided(void *arg) {
  attack *at = arg;
  at->taken = verdict(at->socks[0], VERDICT_WAIT_S) == 1;
  if (ftruncate(at->unsealed, 0) != 0)
    fprintf(stderr, "hostile: cutting the unsealed segment: %s\n", strerror(errno));
  return NULL;
}

/* Rank 0: every hostile hello queued at rank 2's listener, ahead of rank 0's own connection,
 * which its first collective with rank 2 makes. 0, or -1 with a message on stderr. */
static int attack_begin(hoop_comm *comm, member_job *job, attack *at) {
  const hoop__tctx *shm = hoop__transport_of(comm, VICTIM);
  if (strcmp(shm->ops->name, "shm") != 0) {
    fprintf(stderr, "hostile: rank 2 is reached over %s, not shm\n", shm->ops->name);
    return -1;
  }
  for (double waited = 0; !atomic_load(&job->victim_counted); waited += 0.01) {
    if (waited > JOB_TIMEOUT_S) {
      fprintf(stderr, "hostile: rank 2 never counted its descriptors\n");
      return -1;
    }
    nap(0.01);
  }
  for (size_t i = 0; i < HELLOS; i++) {
    int memfd = make_segment(&hellos[i]);
    at->socks[i] = memfd < 0 ? -1 : send_hello(shm, &hellos[i], memfd);
    if (at->socks[i] < 0) {
      if (memfd >= 0)
        close(memfd);
      return -1;
    }
    if (i == 0)
      at->unsealed = memfd;
    else
      close(memfd);
    fprintf(stderr, "hostile: sent rank %d %s\n", hellos[i].target, hellos[i].what);
  }
  atomic_store(&job->attack_sent, 1);
  if (pthread_create(&at->cutter, NULL, cut_when_decided, at) != 0) {
    fprintf(stderr, "hostile: pthread_create failed\n");
    return -1;
  }
  at->cutter_running = 1;
  return 0;
}

/* Rank 0, after the collectives (rank 2 has accepted rank 0's own connection, so every hello
 * queued ahead of it was decided): each must have been refused. 0, or -1 saying which was not. */
static int attack_end(attack *at) {
  int bad = 0;
  if (at->cutter_running) {
    pthread_join(at->cutter, NULL);
    if (at->taken) {
      fprintf(stderr, "hostile: rank 2 answered '%s': expected a refusal\n", hellos[0].what);
      bad = -1;
    }
  }
  for (size_t i = 1; i < HELLOS; i++) {
    int said = at->socks[i] >= 0 ? verdict(at->socks[i], 5.0) : 0;
    if (said != 0) {
      fprintf(stderr, "hostile: rank 2 %s '%s': expected it to close the connection\n",
              said > 0 ? "answered" : "kept silent on", hellos[i].what);
      bad = -1;
    }
  }
  for (size_t i = 0; i < HELLOS; i++)
    if (at->socks[i] >= 0)
      close(at->socks[i]);
  if (at->unsealed >= 0)
    close(at->unsealed);
  return bad;
}

/* Collectives every rank runs after the attack, each checked against its closed form: alltoalls
 * (which connect the pair 0-2) around 20 allreduces of sizes that take one slot, several, and the
 * single-copy path where it is used. 0, or -1 with the first wrong element on stderr. */
static int alltoall_checked(hoop_comm *comm, int rank, int n) {
  enum { BLOCK = 100 };
  int64_t send[RANKS * BLOCK] = {0}, recv[RANKS * BLOCK] = {0};
  for (int j = 0; j < n; j++)
    for (int k = 0; k < BLOCK; k++)
      send[j * BLOCK + k] = (int64_t)rank * 1000000 + j * 1000 + k;
  hoop_result result = hoop_alltoall(comm, send, recv, BLOCK, HOOP_INT64);
  if (result != HOOP_OK) {
    fprintf(stderr, "rank %d: hoop_alltoall: %s\n", rank, hoop_last_error(comm));
    return -1;
  }
  for (int i = 0; i < n; i++)
    for (int k = 0; k < BLOCK; k++) {
      int64_t want = (int64_t)i * 1000000 + rank * 1000 + k;
      if (recv[i * BLOCK + k] != want) {
        fprintf(stderr,
                "rank %d: alltoall element %d of rank %d's block: expected %lld, got %lld\n", rank,
                k, i, (long long)want, (long long)recv[i * BLOCK + k]);
        return -1;
      }
    }
  return 0;
}

static int allreduces_checked(hoop_comm *comm, int rank, int n) {
  static const size_t counts[] = {1, 1000, 100000};
  int64_t *buf = malloc(100000 * sizeof *buf);
  if (!buf)
    return -1;
  int bad = 0;
  for (int round = 0; round < 20 && !bad; round++) {
    size_t count = counts[round % 3];
    for (size_t k = 0; k < count; k++)
      buf[k] = (int64_t)(rank + 1) * (int64_t)(k + 1) + round;
    if (hoop_allreduce(comm, buf, buf, count, HOOP_INT64, HOOP_SUM) != HOOP_OK) {
      fprintf(stderr, "rank %d: hoop_allreduce %d: %s\n", rank, round, hoop_last_error(comm));
      bad = -1;
      break;
    }
    for (size_t k = 0; k < count; k++) {
      int64_t want = (int64_t)(k + 1) * n * (n + 1) / 2 + (int64_t)n * round;
      if (buf[k] != want) {
        fprintf(stderr,
                "rank %d: allreduce %d (%zu elements), element %zu: expected %lld, got %lld\n",
                rank, round, count, k, (long long)want, (long long)buf[k]);
        bad = -1;
        break;
      }
    }
  }
  free(buf);
  return bad;
}

/* A rank of the job joined over transport, its stderr (the library's log too) in
 * DIR/rank<N>.log; NULL when it could not (*code: what the rank exits with). */
static hoop_comm *join_logged(const member_job *job, int rank, int n, const char *transport,
                              int *code) {
  char path[128];
  snprintf(path, sizeof path, "%s/rank%d.log", job->dir, rank);
  int log = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  *code = 3;
  if (log < 0 || dup2(log, 2) < 0)
    return NULL;
  close(log);
  setvbuf(stderr, NULL, _IONBF, 0);
  setenv("HOOP_DEBUG", "info", 1);
  *code = 2;
  return procs_join(job->port, rank, n, JOB_TIMEOUT_S, transport);
}

/* One rank of the job over shared memory. */
static int member_rank(int rank, int n, void *arg) {
  member_job *job = arg;
  int code;
  hoop_comm *comm = join_logged(job, rank, n, "shm", &code);
  if (!comm)
    return code;
  int bad = 0, fds_before = open_fds();
  attack at = {.unsealed = -1};
  for (size_t i = 0; i < HELLOS; i++)
    at.socks[i] = -1;
  if (rank == VICTIM)
    atomic_store(&job->victim_counted, 1);
  if (rank == HOSTILE) {
    atomic_store(&job->hostile_pid, (long)getpid());
    bad |= attack_begin(comm, job, &at);
    atomic_store(&job->attack_sent, 1); /* also when it failed: rank 1 must not wait forever */
  }
  for (double waited = 0; rank == 1 && !atomic_load(&job->attack_sent) && waited < JOB_TIMEOUT_S;
       waited += 0.01)
    nap(0.01);
  bad |= alltoall_checked(comm, rank, n);
  bad |= allreduces_checked(comm, rank, n);
  bad |= alltoall_checked(comm, rank, n);
  if (rank == HOSTILE)
    bad |= attack_end(&at);
  /* Rank 2 keeps at most one descriptor more: the socket of the pair 0-2 (its segment's memfd
   * closed once mapped); every refused connection and the segment it brought are closed. (Under
   * the sanitizers the count before may hold one the library closes later: at most, not exactly.)
   */
  int fds_after = open_fds();
  if (rank == VICTIM && fds_after > fds_before + 1) {
    fprintf(stderr,
            "rank 2: %d descriptors open before the attack, %d after: expected %d at most\n",
            fds_before, fds_after, fds_before + 1);
    bad = -1;
  }
  if (hoop_finalize(comm) != HOOP_OK)
    bad = -1;
  fprintf(stderr, "rank %d: %s\n", rank, bad ? "FAILED" : "ok");
  return bad ? 1 : 0;
}

static char *rank_log(const member_job *job, int rank) {
  char path[128];
  snprintf(path, sizeof path, "%s/rank%d.log", job->dir, rank);
  return procs_slurp(path);
}

/* The ranks' shared state, in memory the forked ranks share, with a port and a folder for logs. */
static member_job *new_job(void) {
  member_job *job =
      mmap(NULL, sizeof *job, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ck_assert_msg(job != MAP_FAILED, "mmap of the ranks' shared state failed");
  job->port = procs_free_port();
  snprintf(job->dir, sizeof job->dir, "/tmp/hoop-member-XXXXXX");
  ck_assert_msg(mkdtemp(job->dir) != NULL, "mkdtemp failed");
  atomic_init(&job->victim_counted, 0);
  atomic_init(&job->attack_sent, 0);
  atomic_init(&job->hostile_pid, 0);
  return job;
}

static void end_job(member_job *job) {
  if (!getenv("HOOP_TEST_KEEP")) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", job->dir);
    ck_assert_int_eq(system(cmd), 0);
  }
  munmap(job, sizeof *job);
}

/* ---- over TCP -------------------------------------------------------------------------------- */

/* What rank 3's TCP listener logs for a handshake it refuses (transports/tcp/conn.c). */
#define TCP_REFUSAL                                                                                \
  "tcp: refused a connection that did not present this job's handshake (from 127.0.0.1: not "      \
  "this job's handshake, or a stream already open)"

/* Rank 0: a TCP handshake to rank 3 in rank 1's place (stream 0 of the pair 1-3), as the wire
 * has it: {magic "HOPT", from, stream, streams, cipher}, 16 random bytes, then the proof over
 * them, made with the job's key and rank 0's key pair. The socket, or -1. */
static int forge_tcp(hoop_comm *comm) {
  hoop__tctx *tcp = hoop__transport_of(comm, 3);
  struct sockaddr_storage addr;
  socklen_t len;
  if (strcmp(tcp->ops->name, "tcp") != 0 ||
      hoop__peer_sockaddr(tcp, 3, "hostile", &addr, &len) != HOOP_OK)
    return -1;
  uint8_t hello[20 + 2 * HOOP__WIRE_NONCE], proof[HOOP__AUTH_PROOF];
  hoop__put_be32(hello, 0x54504f48u);
  hoop__put_be32(hello + 4, 1);
  hoop__put_be32(hello + 8, 0);
  hoop__put_be32(hello + 12, (uint32_t)tcp->tcp_streams);
  hoop__put_be32(hello + 16, 0);
  hoop__auth_random(hello + 20, HOOP__WIRE_NONCE);
  hoop__keyring ring = {0};
  hoop__tctx as_other = *tcp;
  as_other.keyring = &ring;
  as_other.rank = 1;
  hoop__link_mac(&as_other, HOOP__AUTH_LINK, "tcp", 1, 3, 0, hello, 20 + HOOP__WIRE_NONCE, proof);
  hoop__keyring_free(&ring);
  memcpy(hello + 20 + HOOP__WIRE_NONCE, proof, HOOP__WIRE_NONCE);
  int fd = hoop__connect_deadline((struct sockaddr *)&addr, len, hoop__now() + 5);
  if (fd >= 0 && hoop__write_full(fd, hello, sizeof hello, hoop__now() + 5) != 0) {
    close(fd);
    fd = -1;
  }
  fprintf(stderr, "hostile: sent rank 3 a TCP handshake in rank 1's place%s\n",
          fd < 0 ? ": FAILED" : "");
  return fd;
}

static int tcp_rank(int rank, int n, void *arg) {
  member_job *job = arg;
  int code;
  hoop_comm *comm = join_logged(job, rank, n, "tcp", &code);
  if (!comm)
    return code;
  int bad = 0, sock = -1;
  if (rank == HOSTILE) {
    atomic_store(&job->hostile_pid, (long)getpid());
    sock = forge_tcp(comm);
    bad |= sock < 0;
    atomic_store(&job->attack_sent, 1);
  }
  for (double waited = 0; rank == 1 && !atomic_load(&job->attack_sent) && waited < JOB_TIMEOUT_S;
       waited += 0.01)
    nap(0.01);
  bad |= alltoall_checked(comm, rank, n);
  bad |= allreduces_checked(comm, rank, n);
  if (rank == HOSTILE && sock >= 0) {
    if (verdict(sock, 5.0) != 0) {
      fprintf(stderr, "hostile: rank 3 kept the handshake in rank 1's place\n");
      bad = -1;
    }
    close(sock);
  }
  if (hoop_finalize(comm) != HOOP_OK)
    bad = -1;
  fprintf(stderr, "rank %d: %s\n", rank, bad ? "FAILED" : "ok");
  return bad ? 1 : 0;
}

START_TEST(test_member_in_another_place_tcp) {
  member_job *job = new_job();
  int failed = procs_fork_ranks(RANKS, tcp_rank, job, 2 * JOB_TIMEOUT_S);
  char *logs[RANKS];
  for (int r = 0; r < RANKS; r++) {
    logs[r] = rank_log(job, r);
    if (failed)
      fprintf(stderr, "---- rank %d's log\n%s", r, logs[r] ? logs[r] : "(none)\n");
  }
  ck_assert_msg(failed == 0, "%d of %d ranks failed (expected none; logs above)", failed, RANKS);
  int refused = logs[3] ? procs_count(logs[3], TCP_REFUSAL) : 0;
  ck_assert_msg(refused == 1, "rank 3 logged %d refusals ('%s'): expected 1", refused, TCP_REFUSAL);
  for (int r = 0; r < RANKS; r++)
    free(logs[r]);
  end_job(job);
}
END_TEST

START_TEST(test_member_hellos_refused) {
  member_job *job = new_job();
  int failed = procs_fork_ranks(RANKS, member_rank, job, 2 * JOB_TIMEOUT_S + VERDICT_WAIT_S);

  char *logs[RANKS];
  for (int r = 0; r < RANKS; r++) {
    logs[r] = rank_log(job, r);
    char ok[32];
    snprintf(ok, sizeof ok, "rank %d: ok\n", r);
    if (failed || !logs[r] || procs_count(logs[r], ok) != 1)
      fprintf(stderr, "---- rank %d's log\n%s", r, logs[r] ? logs[r] : "(none)\n");
  }
  ck_assert_msg(failed == 0, "%d of %d ranks failed (expected none; logs above)", failed, RANKS);
  char refusal[256];
  snprintf(refusal, sizeof refusal, REFUSAL, atomic_load(&job->hostile_pid));
  int refused = logs[VICTIM] ? procs_count(logs[VICTIM], refusal) : 0;
  ck_assert_msg(refused == (int)HELLOS - IMPERSONATED,
                "rank 2 logged %d refusals of rank 0's hellos: expected %zu ('%s')", refused,
                HELLOS - IMPERSONATED, refusal);
  int impersonation = logs[3] ? procs_count(logs[3], refusal) : 0;
  ck_assert_msg(impersonation == IMPERSONATED,
                "rank 3 logged %d refusals of rank 0's hello in rank 1's place: expected %d ('%s')",
                impersonation, IMPERSONATED, refusal);
  for (int r = 0; r < RANKS; r++) {
    char ok[32];
    snprintf(ok, sizeof ok, "rank %d: ok\n", r);
    ck_assert_msg(logs[r] && procs_count(logs[r], ok) == 1,
                  "rank %d's log does not end with '%s' (its log above)", r, ok);
    free(logs[r]);
  }
  end_job(job);
}
END_TEST

static Suite *hostile_member_suite(void) {
  Suite *s = suite_create("hostile_member");
  TCase *tc = tcase_create("shm");
  tcase_set_timeout(tc, 2 * JOB_TIMEOUT_S + VERDICT_WAIT_S + 30);
  tcase_add_test(tc, test_member_hellos_refused);
  tcase_add_test(tc, test_member_in_another_place_tcp);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(hostile_member_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
