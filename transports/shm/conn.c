/* conn.c - the shared-memory transport's setup: the listener (an abstract Unix socket), which
 * peers share this host, and each pair's segment, which the lower rank creates as a memfd and
 * hands to the higher one over the socket; the socket stays open as the pair's doorbell and as
 * the sign of life of the process at its other end. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/env.h"
#include "proto/auth.h"
#include "shm.h"
#include "util/be.h"
#include "util/sockio.h"

#define HELLO_BYTES SHM_HELLO_BYTES
/* The accepting rank's answer: {SHM_HELLO, pad[3], magic, from, pad, probe address, value}, then
 * its proof: the pair's MAC of the acceptor's direction over the hello (so that no acceptor is
 * unproven, as over TCP). */
#define ANSWER_BYTES (16 + 16 + HOOP__WIRE_NONCE)

__attribute__((noinline)) void hoop__shm_segment_close(int memfd) {
  close(memfd);
}

int hoop__shm_segment_make(const char *name, size_t bytes, void **map) {
  *map = NULL;
  int memfd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (memfd < 0)
    return -1;
  if (ftruncate(memfd, (off_t)bytes) == 0 &&
      fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0) {
    void *mapped = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    if (mapped != MAP_FAILED) {
      *map = mapped;
      return memfd;
    }
  }
  int err = errno;
  hoop__shm_segment_close(memfd);
  errno = err;
  return -1;
}

void *hoop__shm_segment_map(int fd, size_t bytes) {
  struct stat st;
  int seals = fcntl(fd, F_GET_SEALS);
  if (fstat(fd, &st) != 0 || st.st_size != (off_t)bytes || seals < 0 ||
      (seals & (F_SEAL_SHRINK | F_SEAL_SEAL)) != (F_SEAL_SHRINK | F_SEAL_SEAL)) {
    errno = 0;
    return NULL;
  }
  void *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return map == MAP_FAILED ? NULL : map;
}

void hoop__shm_unmap(shm_peer *peer) {
  if (peer->seg)
    munmap(peer->seg, sizeof *peer->seg);
  peer->seg = NULL;
  if (peer->fd >= 0)
    close(peer->fd);
  peer->fd = -1;
}

/* ---- which peers share this host ------------------------------------------------------------- */

/* This machine and network namespace: the kernel's boot id and the namespace's inode. Ranks with
 * the same key run on one kernel and reach each other's abstract sockets, so they can pass a
 * memfd; a host name says neither. */
static int host_key(char *out, size_t outlen) {
  char boot[64] = "";
  FILE *file = fopen("/proc/sys/kernel/random/boot_id", "re");
  if (!file)
    return -1;
  int ok = fgets(boot, sizeof boot, file) != NULL;
  fclose(file);
  boot[strcspn(boot, "\n")] = '\0';
  struct stat ns;
  if (!ok || !boot[0] || stat("/proc/self/ns/net", &ns) != 0)
    return -1;
  snprintf(out, outlen, "%s/%" PRIx64 ".%" PRIx64, boot, (uint64_t)ns.st_dev, (uint64_t)ns.st_ino);
  return 0;
}

/* An entry is "KEY/NAME": everything before the last '/' is the host key. */
static size_t key_length(const char *entry) {
  const char *slash = strrchr(entry, '/');
  return slash ? (size_t)(slash - entry) : 0;
}

int hoop__shm_can_reach(const hoop__tctx *ctx, int peer) {
  char mine[HOOP__WIRE_MAX_ADDR + 1], theirs[HOOP__WIRE_MAX_ADDR + 1];
  if (hoop__tctx_entry(ctx, ctx->rank, mine, sizeof mine) != 0 ||
      hoop__tctx_entry(ctx, peer, theirs, sizeof theirs) != 0)
    return 0;
  size_t len = key_length(mine);
  return len > 0 && len == key_length(theirs) && memcmp(mine, theirs, len) == 0;
}

int hoop__shm_kernel_ranks(const hoop__tctx *ctx) {
  char mine[HOOP__WIRE_MAX_ADDR + 1], theirs[HOOP__WIRE_MAX_ADDR + 1];
  if (!ctx->table || hoop__tctx_entry(ctx, ctx->rank, mine, sizeof mine) != 0)
    return 0;
  size_t len = strcspn(mine, "/"); /* the boot id, without the network namespace */
  if (!mine[len])
    return 0;
  int count = 0;
  for (int rank = 0; rank < ctx->size; rank++)
    if (hoop__tctx_entry(ctx, rank, theirs, sizeof theirs) == 0 &&
        strncmp(mine, theirs, len + 1) == 0)
      count++;
  return count;
}

static socklen_t abstract_addr(struct sockaddr_un *addr, const char *name) {
  memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  size_t len = strlen(name);
  if (len > sizeof addr->sun_path - 1)
    len = sizeof addr->sun_path - 1;
  memcpy(addr->sun_path + 1, name, len);
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len);
}

hoop_result hoop__shm_listen(hoop__tctx *ctx, const struct sockaddr *toward, char *addr,
                             size_t addrlen) {
  (void)toward;
  shm_state *state = calloc(1, sizeof *state);
  if (!state)
    return hoop__set_error(ctx->comm, HOOP_ERR_SYSTEM, "shm: out of memory");
  state->listen_fd = -1;
  ctx->state = state;
  state->wake_fd = hoop__wake_open();
  if (state->wake_fd < 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_SYSTEM, "shm: eventfd: %s", strerror(errno));
  const char *onoff = hoop__env_get("HOOP_SHM");
  if (strcmp(onoff, "0") == 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_UNSUPPORTED, "shm: turned off by HOOP_SHM=0");
  if (strcmp(onoff, "1") != 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_INVALID_ARG,
                           "shm: HOOP_SHM '%s' is not 1 (use shared memory between ranks of one "
                           "host) or 0 (do not)",
                           onoff);
  long cma = 0;
  const char *cma_text = hoop__env_get("HOOP_SHM_CMA_BYTES");
  if (strcmp(cma_text, "auto") == 0)
    state->cma_auto = 1;
  else if (hoop__parse_int(cma_text, 0, 1L << 40, &cma) != 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_INVALID_ARG,
                           "shm: HOOP_SHM_CMA_BYTES '%s' is not auto or a number of bytes (0: "
                           "never)",
                           cma_text);
  state->cma_min = (size_t)cma;
  const char *spin = hoop__env_get("HOOP_SHM_SPIN_US");
  long spin_us = -1;
  if (strcmp(spin, "auto") != 0 && hoop__parse_int(spin, 0, 1000000, &spin_us) != 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_INVALID_ARG,
                           "shm: HOOP_SHM_SPIN_US '%s' is not auto or a number of microseconds "
                           "(0-1000000)",
                           spin);
  state->spin_s = spin_us < 0 ? -1.0 : (double)spin_us * 1e-6;
  const char *membarrier = hoop__env_get("HOOP_SHM_MEMBARRIER");
  if (strcmp(membarrier, "0") != 0 && strcmp(membarrier, "1") != 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_INVALID_ARG,
                           "shm: HOOP_SHM_MEMBARRIER '%s' is not 1 (fence sleeping peers with "
                           "membarrier) or 0 (fence every message)",
                           membarrier);

  char key[128];
  if (host_key(key, sizeof key) != 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_UNSUPPORTED,
                           "shm: cannot tell which host this is (/proc/sys/kernel/random/boot_id "
                           "or /proc/self/ns/net unreadable)");
  uint8_t random[8];
  if (getrandom(random, sizeof random, 0) != (ssize_t)sizeof random ||
      getrandom(&state->probe, sizeof state->probe, 0) != (ssize_t)sizeof state->probe)
    return hoop__set_error(ctx->comm, HOOP_ERR_SYSTEM, "shm: getrandom: %s", strerror(errno));
  snprintf(state->name, sizeof state->name, "hoop-shm-%ld-%016" PRIx64, (long)getpid(),
           hoop__get_be64(random));
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_UNSUPPORTED, "shm: socket: %s", strerror(errno));
  state->listen_fd = fd;
  struct sockaddr_un local;
  socklen_t local_len = abstract_addr(&local, state->name);
  if (bind(fd, (struct sockaddr *)&local, local_len) != 0 || listen(fd, 512) != 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_UNSUPPORTED, "shm: bind/listen on @%s: %s",
                           state->name, strerror(errno));
  snprintf(addr, addrlen, "%s/%s", key, state->name);
  HOOP__TRACE(HOOP_SUBSYS_NET, "shm: listening on @%s (host %s)", state->name, key);
  return HOOP_OK;
}

/* ---- connecting ------------------------------------------------------------------------------ */

static hoop_result ensure_peers(hoop__tctx *ctx) {
  shm_state *state = shm_of(ctx);
  if (state->peers)
    return HOOP_OK;
  state->peers = calloc((size_t)ctx->size, sizeof *state->peers);
  if (!state->peers)
    return hoop__fail(ctx->comm, HOOP_ERR_SYSTEM, "shm: out of memory for %d peers", ctx->size);
  for (int p = 0; p < ctx->size; p++)
    state->peers[p].fd = -1;
  return HOOP_OK;
}

static pid_t peer_pid(int fd) {
  struct ucred cred;
  socklen_t len = sizeof cred;
  return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 ? cred.pid : 0;
}

/* Whether the process at the other end of fd runs as this process's user (a job's ranks do; a
 * stranger on this host may reach the abstract socket, but not as this user). */
static int same_user(int fd, uid_t *uid) {
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    return 0;
  *uid = cred.uid;
  return cred.uid == geteuid();
}

/* Whether this rank can read the peer's memory with process_vm_readv: it reads the value the
 * peer published at addr. Says why not in why. */
static int probe_cma(pid_t pid, uint64_t addr, uint64_t expect, char *why, size_t whylen) {
  if (pid <= 0) {
    snprintf(why, whylen, "its process id is not visible here (another pid namespace)");
    return 0;
  }
  uint64_t got = 0;
  struct iovec local = {&got, sizeof got}, remote = {(void *)(uintptr_t)addr, sizeof got};
  ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
  if (n == (ssize_t)sizeof got && got == expect)
    return 1;
  if (n < 0 && errno == EPERM) {
    char scope[16] = "";
    FILE *file = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
    if (file) {
      if (!fgets(scope, sizeof scope, file))
        scope[0] = '\0';
      fclose(file);
    }
    scope[strcspn(scope, "\n")] = '\0';
    snprintf(why, whylen,
             "process_vm_readv is not permitted%s%s%s (ranks must be allowed to ptrace each "
             "other)",
             scope[0] ? " (kernel.yama.ptrace_scope=" : "", scope, scope[0] ? ")" : "");
  } else if (n < 0) {
    snprintf(why, whylen, "process_vm_readv: %s", strerror(errno));
  } else {
    snprintf(why, whylen, "process_vm_readv read another process's memory (pid %ld)", (long)pid);
  }
  return 0;
}

/* HOOP_SHM_CMA_BYTES=auto. Ranks with a CPU each copy every message through the segment: the
 * sender copies into a slot while the receiver copies the one before out, two cores at work,
 * where with process_vm_readv the receiver copies alone, pinning the sender's pages call by call,
 * and the sender waits. Ranks that outnumber the CPUs read large messages in one copy: with no
 * core to spare, the copy that is not made is what counts. Measured on the 2-core development
 * VM, median p50 of 8 alternated rounds (bench/TUNING.md): 2 ranks, through the segment against
 * CMA from 256 KiB, allreduce 0.68-0.80 at 1-64 MiB, broadcast 0.43-0.71, allgather 0.49 and 0.74
 * at 1 and 4 MiB, level at 16 and 64; 4 ranks, mixed (0.46-1.26). */
#define CMA_CROWDED_BYTES (256 * 1024)

/* What waits for the rank table to say how many ranks share the host (the CMA cut-over under
 * auto, whether bells fence), made at the first connection, before any message. Ranks that
 * outnumber the CPUs sleep after a short spin, often: there each sleep's membarrier would interrupt
 * the peers' CPUs as often, and the fence it saves is small beside the yields, so they fence every
 * message (data.c's bells). */
static void settle(hoop__tctx *ctx) {
  shm_state *state = shm_of(ctx);
  if (state->settled)
    return;
  state->settled = 1;
  int crowded = hoop__host_oversubscribed(ctx->comm);
  state->asym = hoop__shm_asym() && !crowded;
  HOOP__TRACE(HOOP_SUBSYS_NET, "shm: %s",
              state->asym ? "a rank about to sleep fences its peers with membarrier; messages "
                            "to an awake peer need no fence"
              : crowded   ? "this host's ranks outnumber its CPUs: every message fences"
                          : "membarrier is off or refused: every message fences");
  if (!state->cma_auto)
    return;
  state->cma_min = crowded ? CMA_CROWDED_BYTES : 0;
  HOOP__TRACE(HOOP_SUBSYS_NET, "HOOP_SHM_CMA_BYTES=auto: %zu (%d ranks on this host)",
              state->cma_min, ctx->local_size);
}

static void decide_cma(hoop__tctx *ctx, int peer, uint64_t addr, uint64_t expect) {
  shm_state *state = shm_of(ctx);
  shm_peer *p = &state->peers[peer];
  char why[256] = "";
  settle(ctx);
  int can = state->cma_min > 0 && probe_cma(p->pid, addr, expect, why, sizeof why);
  if (state->cma_min == 0)
    snprintf(why, sizeof why, "%s",
             strcmp(hoop__env_get("HOOP_SHM_CMA_BYTES"), "auto") == 0
                 ? "HOOP_SHM_CMA_BYTES=auto, and this host has a CPU for each of its ranks"
                 : "HOOP_SHM_CMA_BYTES=0");
  atomic_store(&p->seg->can_read[p->side].flag, (uint32_t)can);
  if (can)
    HOOP__INFO(HOOP_SUBSYS_NET,
               "shm: rank %d reads rank %d's messages of %zu bytes and more straight from its "
               "memory (process_vm_readv, one copy); smaller ones through the segment",
               ctx->rank, peer, state->cma_min);
  else
    HOOP__INFO(HOOP_SUBSYS_NET,
               "shm: rank %d takes every message of rank %d through the segment (two copies): "
               "%s",
               ctx->rank, peer, why);
}

/* The lower rank of the pair: create the segment, connect, hand it over with this rank's hello.
 * It does not wait for the answer: the peer may be busy until it posts a transfer to this rank,
 * and this rank may place messages in the segment meanwhile. */
static hoop_result connect_peer(hoop__tctx *ctx, int peer) {
  shm_state *state = shm_of(ctx);
  shm_peer *p = &state->peers[peer];
  const char *entry = ctx->table->peers[peer].addr;
  const char *name = strrchr(entry, '/');
  if (!name || !name[1])
    return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL, "shm: rank %d published a bad address '%s'",
                      peer, entry);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return hoop__fail(ctx->comm, HOOP_ERR_SYSTEM, "shm: socket: %s", strerror(errno));
  p->fd = fd;
  struct sockaddr_un addr;
  socklen_t addr_len = abstract_addr(&addr, name + 1);
  /* A listener whose queue is full (the peer busy elsewhere, or another process of this user
   * keeping it full) says EAGAIN: try again until the timeout, never blocking past it. */
  double deadline = hoop__now() + ctx->timeout_s;
  while (connect(fd, (struct sockaddr *)&addr, addr_len) != 0) {
    if (errno != EAGAIN && errno != EINTR)
      return hoop__peer_failed(ctx, peer, HOOP_ERR_PEER_LOST, "connect", strerror(errno));
    if (hoop__now() >= deadline)
      return hoop__peer_failed(ctx, peer, HOOP_ERR_TIMEOUT, "connect",
                               "its listener's queue stayed full for the timeout (busy, or kept "
                               "full by another process of this user)");
    hoop_result news = hoop__check_abort(ctx->comm);
    if (news != HOOP_OK || *ctx->failed)
      return news != HOOP_OK ? news : *ctx->failed;
    poll(NULL, 0, 1);
  }
  /* The segment goes to the listener only if it runs as this user: another user listening under
   * the peer's name would get the pair's memory. */
  uid_t uid = 0;
  if (!same_user(fd, &uid)) {
    char why[96];
    snprintf(why, sizeof why, "its listener runs as user %lu, not this rank's %lu",
             (unsigned long)uid, (unsigned long)geteuid());
    return hoop__peer_failed(ctx, peer, HOOP_ERR_PEER_LOST, "connect", why);
  }
  p->pid = peer_pid(fd);

  void *map;
  int memfd = hoop__shm_segment_make("hoop-shm", sizeof(shm_segment), &map);
  if (memfd < 0)
    return hoop__fail(ctx->comm, HOOP_ERR_SYSTEM, "shm: a %zu-byte segment for rank %d: %s",
                      sizeof(shm_segment), peer, strerror(errno));
  p->seg = map;
  p->side = 0;
  p->seg->magic = SHM_MAGIC;
  p->seg->version = SHM_VERSION;
  atomic_store(&p->seg->asym[0].flag, (uint32_t)state->asym);

  uint8_t hello[HELLO_BYTES];
  hoop__put_be32(hello, SHM_MAGIC);
  hoop__put_be32(hello + 4, SHM_VERSION);
  hoop__put_be32(hello + 8, (uint32_t)ctx->rank);
  hoop__put_be32(hello + 12, (uint32_t)peer);
  hoop__link_proof(ctx, "shm", (uint32_t)ctx->rank, (uint32_t)peer, 0, hello + 16);
  hoop__put_be64(hello + 16 + HOOP__WIRE_NONCE, (uint64_t)(uintptr_t)&state->probe);
  hoop__put_be64(hello + 24 + HOOP__WIRE_NONCE, state->probe);
  memcpy(p->hello, hello, sizeof hello);
  ssize_t sent = hoop__send_with_fd(fd, hello, sizeof hello, memfd);
  int err = errno;
  hoop__shm_segment_close(memfd);
  if (sent != (ssize_t)sizeof hello)
    return hoop__peer_failed(ctx, peer, HOOP_ERR_PEER_LOST, "handing over the segment",
                             sent < 0 ? strerror(err) : "short write");
  HOOP__TRACE(HOOP_SUBSYS_NET, "shm: connected to rank %d (pid %ld), %zu-byte segment", peer,
              (long)p->pid, sizeof(shm_segment));
  return HOOP_OK;
}

/* A connection just accepted: another user's process may reach the abstract socket, and is
 * refused before anything of it is read; a job's own come from processes of its user. */
static int shm_admit(hoop__pending_conn *conn, char *why, size_t whylen) {
  uid_t uid = 0;
  pid_t pid = peer_pid(conn->fd);
  snprintf(conn->from, sizeof conn->from, "pid %ld", (long)pid);
  if (!same_user(conn->fd, &uid)) {
    snprintf(why, whylen, "user %lu, and this job runs as %lu", (unsigned long)uid,
             (unsigned long)geteuid());
    return -1;
  }
  return 0;
}

/* Read what has come of a hello and the segment's descriptor, which comes with its first byte.
 * Every descriptor that arrives but that one is closed at once and refuses the connection:
 * several, one in a later message, or any with a message whose control data was cut (past
 * HOOP__RECV_FDS_MAX in one message the kernel closes them), so a stranger sending many costs
 * nothing. */
static int shm_read(hoop__pending_conn *conn, size_t bytes, char *why, size_t whylen) {
  while (conn->got < bytes) {
    int fds[HOOP__RECV_FDS_MAX], nfds, cut;
    ssize_t n =
        hoop__recv_with_fds(conn->fd, conn->buf + conn->got, bytes - conn->got, fds, &nfds, &cut);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
      return 0;
    int extra = 0; /* descriptors beyond the one a hello brings */
    for (int i = 0; i < nfds; i++) {
      if (conn->memfd < 0 && conn->got == 0 && nfds == 1) {
        conn->memfd = fds[i];
      } else {
        close(fds[i]);
        extra = 1;
      }
    }
    if (n <= 0 || extra || cut) {
      snprintf(why, whylen, "%s after %zu bytes",
               n < 0    ? strerror(errno)
               : n == 0 ? "closed"
                        : "descriptors a hello does not bring",
               conn->got);
      return -1;
    }
    conn->got += (size_t)n;
  }
  if (conn->memfd < 0) {
    snprintf(why, whylen, "a hello without its segment's descriptor");
    return -1;
  }
  return 1;
}

static const hoop__pending_ops shm_pending = {"shm", HELLO_BYTES, shm_admit, shm_read};

/* Accept connections until one presents a hello, check it, map its segment and answer; strangers
 * are closed. */
static hoop_result accept_one(hoop__tctx *ctx, double deadline) {
  shm_state *state = shm_of(ctx);
  hoop__pending_conn conn;
  hoop_result waited = hoop__pending_accept(ctx, &state->pending, &shm_pending, state->listen_fd,
                                            state->wake_fd, deadline, &conn);
  if (waited != HOOP_OK)
    return waited;
  int fd = conn.fd, memfd = conn.memfd;
  const uint8_t *hello = conn.buf;
  void *map;
  uint32_t from = hoop__get_be32(hello + 8), to = hoop__get_be32(hello + 12);
  if (hoop__get_be32(hello) != SHM_MAGIC || hoop__get_be32(hello + 4) != SHM_VERSION ||
      from >= (uint32_t)ctx->size || (int)from >= ctx->rank || to != (uint32_t)ctx->rank ||
      state->peers[from].seg || !hoop__link_proof_ok(ctx, "shm", from, to, 0, hello + 16))
    goto refuse;
  /* Sealed against shrinking, so that no member can cut the mapping under this rank (SIGBUS),
   * and against further seals (a write seal added later), as the creator seals it. */
  map = hoop__shm_segment_map(memfd, sizeof(shm_segment));
  if (!map && errno == 0)
    goto refuse;
  if (!map) {
    int err = errno;
    close(memfd);
    close(fd);
    return hoop__fail(ctx->comm, HOOP_ERR_SYSTEM, "shm: mapping rank %u's segment: %s", from,
                      strerror(err));
  }
  close(memfd);
  conn.memfd = -1;
  shm_segment *seg = map;
  if (seg->magic != SHM_MAGIC || seg->version != SHM_VERSION) {
    munmap(map, sizeof(shm_segment));
    goto refuse;
  }
  shm_peer *p = &state->peers[from];
  p->fd = fd;
  p->seg = seg;
  p->side = 1;
  p->pid = peer_pid(fd);
  p->answered = 1;
  decide_cma(ctx, (int)from, hoop__get_be64(hello + 16 + HOOP__WIRE_NONCE),
             hoop__get_be64(hello + 24 + HOOP__WIRE_NONCE));
  atomic_store(&seg->asym[1].flag, (uint32_t)state->asym);
  uint8_t answer[ANSWER_BYTES] = {SHM_HELLO};
  hoop__put_be32(answer + 4, SHM_MAGIC);
  hoop__put_be32(answer + 8, (uint32_t)ctx->rank);
  hoop__put_be64(answer + 16, (uint64_t)(uintptr_t)&state->probe);
  hoop__put_be64(answer + 24, state->probe);
  hoop__link_tag(ctx, HOOP__AUTH_REPLY, "shm", (uint32_t)ctx->rank, from, 0, hello, HELLO_BYTES,
                 answer + 32);
  /* A peer that already finished (its call failed on its own, a job of one call) has closed its
   * end after its bye or notice: what it said, or its silence, tells which. */
  if (send(fd, answer, sizeof answer, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof answer)
    return hoop__shm_read_socket(ctx, (int)from);
  HOOP__TRACE(HOOP_SUBSYS_NET, "shm: accepted rank %u (pid %ld)", from, (long)p->pid);
  return HOOP_OK;
refuse:
  hoop__pending_refuse(&conn, "shm",
                       "not this job's hello, or a segment not sealed against shrinking");
  return HOOP_OK;
}

hoop_result hoop__shm_connect(hoop__tctx *ctx, int peer) {
  hoop_result result = ensure_peers(ctx);
  shm_state *state = shm_of(ctx);
  settle(ctx);
  if (result != HOOP_OK || state->peers[peer].seg)
    return result;
  if (ctx->rank < peer)
    return connect_peer(ctx, peer);
  double deadline = hoop__now() + ctx->timeout_s;
  while (!state->peers[peer].seg) {
    result = accept_one(ctx, deadline);
    if (result == HOOP_ERR_TIMEOUT)
      return hoop__peer_failed(ctx, peer, HOOP_ERR_TIMEOUT, "waiting for it to connect",
                               strerror(ETIMEDOUT));
    if (result != HOOP_OK)
      return result;
  }
  return HOOP_OK;
}

/* ---- the pair's socket ----------------------------------------------------------------------- */

static hoop_result take_answer(hoop__tctx *ctx, int peer, const uint8_t *msg) {
  shm_peer *p = &shm_of(ctx)->peers[peer];
  if (p->side != 0 || p->answered || hoop__get_be32(msg + 4) != SHM_MAGIC ||
      hoop__get_be32(msg + 8) != (uint32_t)peer)
    return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL, "shm: rank %d sent a malformed answer", peer);
  if (!hoop__link_tag_ok(ctx, HOOP__AUTH_REPLY, "shm", (uint32_t)peer, (uint32_t)ctx->rank, 0,
                         p->hello, HELLO_BYTES, msg + 32))
    return hoop__peer_failed(ctx, peer, HOOP_ERR_AUTH, "connect",
                             "the end that answered at its address did not prove to be it (it "
                             "lacks the pair's key)");
  p->answered = 1;
  decide_cma(ctx, peer, hoop__get_be64(msg + 16), hoop__get_be64(msg + 24));
  return HOOP_OK;
}

/* The control messages at the start of the peer's input: act on each complete one and keep what
 * is left of an incomplete one. */
static hoop_result take_control(hoop__tctx *ctx, int peer) {
  shm_peer *p = &shm_of(ctx)->peers[peer];
  size_t used = 0;
  hoop_result result = HOOP_OK;
  while (used < p->in_len && result == HOOP_OK) {
    const uint8_t *msg = p->in + used;
    size_t left = p->in_len - used, need;
    switch (msg[0]) {
    case SHM_BELL: need = 1; break;
    case SHM_BYE:
      need = 1;
      p->said_bye = 1;
      break;
    case SHM_BOARD:
      need = SHM_BOARD_BYTES;
      if (left >= need)
        result = hoop__shm_board_came(ctx, peer, msg);
      break;
    case SHM_HELLO:
      need = ANSWER_BYTES;
      if (left >= need)
        result = take_answer(ctx, peer, msg);
      break;
    case SHM_NOTICE:
      need = left >= 4 ? SHM_NOTICE_HEAD + hoop__get_be16(msg + 2) : SHM_NOTICE_HEAD;
      if (need > SHM_NOTICE_HEAD + SHM_NOTICE_MAX)
        return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL, "shm: rank %d sent a malformed notice",
                          peer);
      if (left >= need) {
        char text[SHM_NOTICE_MAX + 1];
        memcpy(text, msg + SHM_NOTICE_HEAD, need - SHM_NOTICE_HEAD);
        text[need - SHM_NOTICE_HEAD] = '\0';
        result = hoop__peer_notice(ctx->comm, peer, (hoop_result)hoop__get_be32(msg + 4),
                                   (int)hoop__get_be32(msg + 8), text);
      }
      break;
    default:
      return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL,
                        "shm: rank %d sent an unknown control message (%u)", peer, msg[0]);
    }
    if (left < need)
      break;
    used += need;
  }
  memmove(p->in, p->in + used, p->in_len - used);
  p->in_len -= used;
  return result;
}

hoop_result hoop__shm_read_socket(hoop__tctx *ctx, int peer) {
  shm_peer *p = &shm_of(ctx)->peers[peer];
  while (p->fd >= 0 && !p->eof) {
    /* Boards' descriptors come on the socket too (board.c): kept in the order they came. */
    int fds[HOOP__RECV_FDS_MAX], nfds, cut;
    ssize_t n =
        hoop__recv_with_fds(p->fd, p->in + p->in_len, sizeof p->in - p->in_len, fds, &nfds, &cut);
    for (int i = 0; i < nfds; i++)
      hoop__shm_fd_came(ctx, peer, fds[i]);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return HOOP_OK;
    if (n <= 0) {
      p->eof = 1;
      if (p->said_bye)
        return HOOP_OK;
      return hoop__peer_failed(
          ctx, peer, HOOP_ERR_PEER_LOST, "its end of the pair closed",
          n < 0 && errno != ECONNRESET ? strerror(errno) : "the process ended without finalizing");
    }
    p->in_len += (size_t)n;
    hoop_result result = take_control(ctx, peer);
    if (result != HOOP_OK || *ctx->failed)
      return result != HOOP_OK ? result : *ctx->failed;
  }
  return HOOP_OK;
}
