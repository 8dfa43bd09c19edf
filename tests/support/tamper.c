/* tamper.c - loaded with LD_PRELOAD by tests/test_encrypt.sh into one rank: a man in the middle of
 * its TCP connections, acting where its encrypted records leave it (HOOP_ENCRYPT's seal sends
 * each record with send(2)). TAMPER=flip changes one byte in the middle of the TAMPER_AT-th send
 * of at least 1 KiB on a TCP socket; TAMPER=replay sends the TAMPER_AT-th such send that holds a
 * whole record (its length, its text, its tag) a second time, right after the first. Every other
 * send goes through as it is. Prints what it did on stderr. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_NEXT; configure may have defined it already */
#endif
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef ssize_t (*send_fn)(int, const void *, size_t, int);

static atomic_long sends;

/* Whether len bytes at buf are one whole record of transports/tcp/seal.h: a u32 length, the
 * text, a 16-byte tag. */
static int whole_record(const void *buf, size_t len) {
  const unsigned char *b = buf;
  size_t text = (size_t)b[0] << 24 | (size_t)b[1] << 16 | (size_t)b[2] << 8 | b[3];
  return len >= 4 && 4 + text + 16 == len;
}

static int over_tcp(int fd) {
  int domain = 0, type = 0;
  socklen_t len = sizeof domain;
  if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0)
    return 0;
  len = sizeof type;
  return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM &&
         (domain == AF_INET || domain == AF_INET6);
}

/* All of len bytes, waiting for room: a replayed record must arrive whole. */
static void send_whole(send_fn real, int fd, const char *buf, size_t len, int flags) {
  for (size_t done = 0; done < len;) {
    ssize_t n = real(fd, buf + done, len - done, flags);
    if (n > 0) {
      done += (size_t)n;
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      struct pollfd pfd = {.fd = fd, .events = POLLOUT};
      poll(&pfd, 1, 100);
    } else {
      return;
    }
  }
}

ssize_t send(int fd, const void *buf, size_t len, int flags) {
  send_fn real = (send_fn)dlsym(RTLD_NEXT, "send");
  const char *mode = getenv("TAMPER"), *at = getenv("TAMPER_AT");
  if (!mode || !at || len < 1024 || !over_tcp(fd) ||
      (strcmp(mode, "replay") == 0 && !whole_record(buf, len)) ||
      atomic_fetch_add(&sends, 1) + 1 != atol(at))
    return real(fd, buf, len, flags);
  if (strcmp(mode, "flip") == 0) {
    char *copy = malloc(len);
    if (!copy)
      return real(fd, buf, len, flags);
    memcpy(copy, buf, len);
    copy[len / 2] ^= 0x20;
    ssize_t n = real(fd, copy, len, flags);
    free(copy);
    fprintf(stderr, "tamper: changed byte %zu of a send of %zu bytes\n", len / 2, len);
    return n;
  }
  ssize_t n = real(fd, buf, len, flags);
  if (n == (ssize_t)len && strcmp(mode, "replay") == 0) {
    send_whole(real, fd, buf, len, flags);
    fprintf(stderr, "tamper: sent a whole record of %zu bytes twice\n", len);
  } else if (strcmp(mode, "replay") == 0) {
    atomic_fetch_sub(&sends, 1); /* not all written: replay the next one instead */
  }
  return n;
}
