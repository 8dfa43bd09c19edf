/* sockio.c - deadline-bounded socket I/O for setup exchanges (see sockio.h). */
#include "util/sockio.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "util/clock.h"

int hoop__poll_one(int fd, short events, double deadline) {
  for (;;) {
    double left = deadline - hoop__now();
    if (left <= 0) {
      errno = ETIMEDOUT;
      return -1;
    }
    struct pollfd pfd = {.fd = fd, .events = events};
    int ms = left > 1000 ? 1000 : (int)(left * 1000) + 1;
    int rc = poll(&pfd, 1, ms);
    if (rc < 0 && errno != EINTR)
      return -1;
    if (rc > 0)
      return 0; /* readiness or an error condition: the next read/write tells which */
  }
}

ssize_t hoop__send_with_fd(int sock, const void *buf, size_t len, int fd) {
  struct iovec iov = {(void *)buf, len};
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } control;
  memset(&control, 0, sizeof control);
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  if (fd >= 0) {
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof control.buf;
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cmsg), &fd, sizeof fd);
  }
  ssize_t sent;
  do
    sent = sendmsg(sock, &msg, MSG_NOSIGNAL);
  while (sent < 0 && errno == EINTR);
  return sent;
}

ssize_t hoop__recv_with_fds(int sock, void *buf, size_t len, int *fds, int *nfds, int *cut) {
  union {
    char buf[CMSG_SPACE(HOOP__RECV_FDS_MAX * sizeof(int))];
    struct cmsghdr align;
  } control;
  struct iovec iov = {buf, len};
  struct msghdr msg = {.msg_iov = &iov,
                       .msg_iovlen = 1,
                       .msg_control = control.buf,
                       .msg_controllen = sizeof control.buf};
  ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  *nfds = 0;
  *cut = n >= 0 && (msg.msg_flags & MSG_CTRUNC) != 0;
  for (struct cmsghdr *cmsg = n >= 0 ? CMSG_FIRSTHDR(&msg) : NULL; cmsg;
       cmsg = CMSG_NXTHDR(&msg, cmsg)) {
    if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS ||
        cmsg->cmsg_len < CMSG_LEN(0))
      continue;
    size_t count = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count && *nfds < HOOP__RECV_FDS_MAX; i++)
      memcpy(&fds[(*nfds)++], CMSG_DATA(cmsg) + i * sizeof(int), sizeof(int));
  }
  return n;
}

int hoop__write_full(int fd, const void *buf, size_t len, double deadline) {
  const char *p = buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (hoop__poll_one(fd, POLLOUT, deadline) != 0)
        return -1;
    } else {
      return -1;
    }
  }
  return 0;
}

int hoop__read_full(int fd, void *buf, size_t len, double deadline) {
  char *p = buf;
  while (len > 0) {
    ssize_t n = recv(fd, p, len, 0);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
    } else if (n == 0) {
      errno = ECONNRESET;
      return -1;
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (hoop__poll_one(fd, POLLIN, deadline) != 0)
        return -1;
    } else {
      return -1;
    }
  }
  return 0;
}

int hoop__connect_deadline(const struct sockaddr *addr, socklen_t addrlen, double deadline) {
  int fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (connect(fd, addr, addrlen) != 0 && errno != EINPROGRESS)
    goto fail;
  if (hoop__poll_one(fd, POLLOUT, deadline) != 0)
    goto fail;
  int soerr = 0;
  socklen_t soerrlen = sizeof soerr;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &soerrlen) != 0)
    goto fail;
  if (soerr != 0) {
    errno = soerr;
    goto fail;
  }
  return fd;
fail:;
  int saved = errno;
  close(fd);
  errno = saved;
  return -1;
}
