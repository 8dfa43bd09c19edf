/* vmm_server.c - VMM descriptors, passed over a Unix socket: this process's server, and an
 * importer's asks (see vmm.h).
 *
 * A process that exports VMM memory serves its allocations' file descriptors on an abstract Unix
 * socket "hoop-vmm-PID-NONCE" (NONCE random, told to the peers in the export), from a thread of
 * its own started at its first VMM export, and a short-lived thread per connection. An importer
 * connects, asks for each piece of an export by its identity (address, allocation handle, buffer
 * id) and the export's token (random, told only to the peers of the call that sent it); the server
 * answers only for pieces of an export of its cache with that token whose allocation is still the
 * one mapped there: it exports it, sends the descriptor (SCM_RIGHTS) and closes its own. Each end
 * checks that the other is a process of the same user (SO_PEERCRED), the importer that it is the
 * exporting process. So no descriptor stays open here between calls (an open one holds its
 * allocation's memory after the program frees it), and nothing needs the permission to ptrace the
 * exporter (pidfd_getfd's, which Yama's default on Ubuntu refuses between sibling processes).
 * Ranks of one host must share a network namespace (abstract sockets live in one).
 */
#include "config.h"

#ifdef HOOP_HAVE_CUDA

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/internal.h"
#include "core/log.h"
#include "mem/cuda/vmm.h"
#include "util/sockio.h"

#define VMM_ASK_MAGIC 0x686f6f702d766d6dull /* "hoop-vmm" */
#define VMM_SERVER_CONNS 32                 /* connections served at once; more are closed */
#define VMM_IDLE_SECONDS 2                  /* an importer that says nothing is not waited for */
#define VMM_ANSWER_SECONDS 10               /* what an importer waits for the server, at most */
typedef struct vmm_ask {
  uint64_t magic, token[2], start, handle, buffer_id;
} vmm_ask;
typedef struct vmm_answer {
  int32_t status; /* 0: the descriptor comes with it */
  char why[124];
} vmm_answer;

static struct {
  pthread_mutex_t lock;
  pid_t pid; /* the process whose server it is (a forked child starts its own) */
  uint64_t nonce;
  int fd;    /* the listening socket */
  int conns; /* connections being served */
} fd_server = {PTHREAD_MUTEX_INITIALIZER, 0, 0, -1, 0};

static socklen_t server_address(struct sockaddr_un *sa, uint64_t pid, uint64_t nonce) {
  memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  int n = snprintf(sa->sun_path + 1, sizeof sa->sun_path - 1, "hoop-vmm-%llu-%016llx",
                   (unsigned long long)pid, (unsigned long long)nonce);
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* Whether the other end of socket fd runs as this process's user (and is pid, when pid > 0). */
static int peer_is(int fd, pid_t pid) {
  struct ucred cred;
  socklen_t len = sizeof cred;
  return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == geteuid() &&
         (pid <= 0 || cred.pid == pid);
}

/* Close every descriptor an SCM_RIGHTS message brought, but the first if keep; that one, or -1. */
static int take_descriptors(struct msghdr *msg, int keep) {
  int first = -1;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
      continue;
    size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (keep && first < 0)
        first = fd;
      else
        close(fd);
    }
  }
  return first;
}

/* The descriptor of the allocation an importer asks for, if this process exported it to that
 * importer's call and it is still the one mapped at its address here: >= 0, or -1 with why. */
static int serve_piece(const vmm_ask *ask, char *why, size_t whylen) {
  if (!hoop__cuda_exported_piece(ask->token, ask->start, ask->handle, ask->buffer_id)) {
    snprintf(why, whylen, "no export of 0x%llx with that token here (freed, or forgotten)",
             (unsigned long long)ask->start);
    return -1;
  }
  CUcontext context = NULL;
  const void *at = (const void *)(uintptr_t)ask->start;
  if (hoop__cuda_kind_and_context(at, &context) != HOOP__MEM_DEVICE || !context ||
      hoop__cuda_drv.ctx_push(context) != CUDA_SUCCESS) {
    snprintf(why, whylen, "no device memory at 0x%llx any more", (unsigned long long)ask->start);
    return -1;
  }
  CUdeviceptr base = 0;
  size_t size = 0;
  uint64_t handle = 0;
  int fd = -1;
  if (hoop__cuda_drv.mem_get_address_range(&base, &size, (CUdeviceptr)ask->start) != CUDA_SUCCESS ||
      base != (CUdeviceptr)ask->start || hoop__cuda_buffer_id_at(base) != ask->buffer_id ||
      (hoop__cuda_vmm_export_piece(base, &fd, &handle, why, whylen) == 0 &&
       handle != ask->handle)) {
    if (fd >= 0)
      close(fd);
    fd = -1;
    snprintf(why, whylen, "the allocation at 0x%llx was freed or replaced",
             (unsigned long long)ask->start);
  }
  CUcontext popped;
  hoop__cuda_drv.ctx_pop(&popped);
  return fd;
}

/* One importer's connection: its asks answered until it closes, errs or idles. */
static void *fd_server_conn(void *arg) {
  int conn = (int)(intptr_t)arg;
  struct timeval idle = {VMM_IDLE_SECONDS, 0};
  setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &idle, sizeof idle);
  setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &idle, sizeof idle);
  vmm_ask ask;
  char control[CMSG_SPACE(sizeof(int) * 4)];
  struct iovec iov = {&ask, sizeof ask};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  for (;;) {
    msg.msg_control = control, msg.msg_controllen = sizeof control;
    ssize_t got = recvmsg(conn, &msg, MSG_CMSG_CLOEXEC);
    if (got < 0 && errno == EINTR)
      continue;
    take_descriptors(&msg, 0); /* an importer sends none */
    if (got != (ssize_t)sizeof ask || ask.magic != VMM_ASK_MAGIC)
      break;
    vmm_answer answer = {0};
    int fd = serve_piece(&ask, answer.why, sizeof answer.why);
    answer.status = fd >= 0 ? 0 : -1;
    int sent =
        hoop__send_with_fd(conn, &answer, sizeof answer, fd) == (ssize_t)sizeof answer ? 0 : -1;
    if (fd >= 0)
      close(fd);
    if (sent != 0)
      break;
  }
  close(conn);
  pthread_mutex_lock(&fd_server.lock);
  fd_server.conns--;
  pthread_mutex_unlock(&fd_server.lock);
  return NULL;
}

static void *fd_server_main(void *arg) {
  int listener = (int)(intptr_t)arg;
  for (;;) {
    int conn = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno == EINTR || errno == ECONNABORTED)
        continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        usleep(10000); /* out of descriptors or memory for a while: the importer waits */
        continue;
      }
      break;
    }
    pthread_mutex_lock(&fd_server.lock);
    int room = fd_server.conns < VMM_SERVER_CONNS && peer_is(conn, 0);
    pthread_t thread;
    if (room && pthread_create(&thread, NULL, fd_server_conn, (void *)(intptr_t)conn) == 0) {
      fd_server.conns++;
      pthread_detach(thread);
    } else {
      close(conn); /* another user's, or too many at once: the importer stages */
    }
    pthread_mutex_unlock(&fd_server.lock);
  }
  /* Whatever stopped it, the next export starts a server anew rather than name a dead one. */
  HOOP__WARN(HOOP_SUBSYS_COLL, "cuda: the VMM descriptor server stops: accept: %s",
             strerror(errno));
  pthread_mutex_lock(&fd_server.lock);
  if (fd_server.fd == listener && fd_server.pid == getpid())
    fd_server.fd = -1, fd_server.pid = 0;
  pthread_mutex_unlock(&fd_server.lock);
  close(listener);
  return NULL;
}

int hoop__cuda_fd_server_start(uint64_t *nonce, char *why, size_t whylen) {
  pthread_mutex_lock(&fd_server.lock);
  int result = 0;
  if (fd_server.pid != getpid()) {
    if (fd_server.fd >= 0)
      close(fd_server.fd); /* a forked child's copy of its parent's */
    fd_server.fd = -1, fd_server.pid = 0, fd_server.conns = 0;
    uint64_t n = 0;
    struct sockaddr_un sa;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    const char *what = "socket";
    if (fd >= 0 && getrandom(&n, sizeof n, 0) != (ssize_t)sizeof n)
      what = "getrandom";
    else if (fd >= 0 &&
             bind(fd, (struct sockaddr *)&sa, server_address(&sa, (uint64_t)getpid(), n)) != 0)
      what = "bind";
    else if (fd >= 0 && listen(fd, 128) != 0)
      what = "listen";
    else if (fd >= 0)
      what = NULL;
    pthread_t thread;
    sigset_t all, old;
    sigfillset(&all);
    if (!what) {
      /* Its threads take none of the program's signals. */
      pthread_sigmask(SIG_SETMASK, &all, &old);
      int err = pthread_create(&thread, NULL, fd_server_main, (void *)(intptr_t)fd);
      pthread_sigmask(SIG_SETMASK, &old, NULL);
      if (err == 0)
        pthread_detach(thread);
      else
        what = "pthread_create", errno = err;
    }
    if (what) {
      snprintf(why, whylen, "cannot serve its VMM descriptors: %s: %s", what, strerror(errno));
      if (fd >= 0)
        close(fd);
      result = -1;
    } else {
      fd_server.fd = fd, fd_server.pid = getpid(), fd_server.nonce = n;
    }
  }
  *nonce = fd_server.nonce;
  pthread_mutex_unlock(&fd_server.lock);
  return result;
}

int hoop__cuda_fd_server_connect(const hoop__cuda_export *export, char *why, size_t whylen) {
  struct sockaddr_un sa;
  socklen_t len = server_address(&sa, export->pid, export->server);
  const char *what = NULL;
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    what = strerror(errno);
  } else if (connect(fd, (struct sockaddr *)&sa, len) != 0 && errno != EINPROGRESS &&
             errno != EAGAIN && errno != EINTR) {
    what = strerror(errno);
  } else {
    /* A full backlog, or a signal: the connection goes on; wait for it, within a deadline. */
    int err = 0;
    socklen_t errlen = sizeof err;
    if (hoop__poll_one(fd, POLLOUT, hoop__now() + VMM_ANSWER_SECONDS) != 0)
      what = strerror(errno);
    else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &errlen) != 0 || err != 0)
      what = strerror(err ? err : errno);
    else if (!peer_is(fd, (pid_t) export->pid))
      what = "the socket is not that process's, or it is another user's";
    else
      return fd;
  }
  if (fd >= 0)
    close(fd);
  snprintf(why, whylen,
           "connecting to pid %llu's VMM descriptor server (an abstract Unix socket: ranks on one "
           "host must share a network namespace): %s",
           (unsigned long long)export->pid, what);
  return -1;
}

int hoop__cuda_fd_server_ask(int sock, const hoop__cuda_export *export,
                             const hoop__cuda_vmm_piece *piece, char *why, size_t whylen) {
  vmm_ask ask = {VMM_ASK_MAGIC,
                 {export->token[0], export->token[1]},
                 piece->start,
                 piece->handle,
                 piece->buffer_id};
  vmm_answer answer = {0};
  char control[CMSG_SPACE(sizeof(int) * 4)];
  struct iovec iov = {&answer, sizeof answer};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  double deadline = hoop__now() + VMM_ANSWER_SECONDS;
  ssize_t got = -1;
  for (;;) { /* asks are small: a SEQPACKET socket takes one whole or not at all */
    ssize_t sent = send(sock, &ask, sizeof ask, MSG_NOSIGNAL);
    if (sent == (ssize_t)sizeof ask)
      break;
    if ((sent >= 0 || (errno != EAGAIN && errno != EINTR)) ||
        hoop__poll_one(sock, POLLOUT, deadline) != 0)
      goto failed;
  }
  for (;;) {
    msg.msg_control = control, msg.msg_controllen = sizeof control;
    got = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (got >= 0 || (errno != EAGAIN && errno != EINTR) ||
        hoop__poll_one(sock, POLLIN, deadline) != 0)
      break;
  }
  if (got >= 0) {
    int fd = take_descriptors(&msg, 1);
    if (got == (ssize_t)sizeof answer && answer.status == 0 && fd >= 0 &&
        !(msg.msg_flags & MSG_CTRUNC))
      return fd;
    if (fd >= 0)
      close(fd);
    answer.why[sizeof answer.why - 1] = '\0';
    if (got == (ssize_t)sizeof answer && answer.status != 0) {
      snprintf(why, whylen, "pid %llu: %s", (unsigned long long)export->pid, answer.why);
      return -1;
    }
    errno = EPROTO;
  }
failed:
  snprintf(why, whylen, "no descriptor from pid %llu's VMM descriptor server: %s",
           (unsigned long long)export->pid,
           got == 0 ? "it closed the connection" : strerror(errno));
  return -1;
}

#endif /* HOOP_HAVE_CUDA */
