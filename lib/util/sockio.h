/* sockio.h - blocking-with-deadline socket I/O for the short exchanges of setup: the rendezvous
 * HELLO/TABLE and the transport's connection handshake. The data path does not use these. */
#ifndef HOOP__SOCKIO_H
#define HOOP__SOCKIO_H

#include <stddef.h>
#include <sys/socket.h>

/* Each returns 0 on success, or -1 with errno set: ETIMEDOUT past deadline (hoop__now() seconds),
 * ECONNRESET when the peer closed before all bytes came. fd may be non-blocking. */
int hoop__write_full(int fd, const void *buf, size_t len, double deadline);
int hoop__read_full(int fd, void *buf, size_t len, double deadline);

/* Connect a new non-blocking TCP socket to addr before deadline. Returns the fd, or -1 with errno
 * set. */
int hoop__connect_deadline(const struct sockaddr *addr, socklen_t addrlen, double deadline);

/* One sendmsg of len bytes of buf, carrying descriptor fd (SCM_RIGHTS) when fd >= 0, again after
 * a signal: what sendmsg returned (MSG_NOSIGNAL; a closed peer is -1 with EPIPE). */
ssize_t hoop__send_with_fd(int sock, const void *buf, size_t len, int fd);
/* One recvmsg of up to len bytes into buf without blocking, close-on-exec descriptors that came
 * with them in fds (up to HOOP__RECV_FDS_MAX, in order; *nfds of them); *cut is 1 when the kernel
 * cut the control data (descriptors beyond the room, which it closed). What recvmsg returned. */
#define HOOP__RECV_FDS_MAX 16
ssize_t hoop__recv_with_fds(int sock, void *buf, size_t len, int *fds, int *nfds, int *cut);

/* Wait until fd is ready for events (POLLIN/POLLOUT); 0 when ready, -1 with ETIMEDOUT past
 * deadline. */
int hoop__poll_one(int fd, short events, double deadline);

#endif /* HOOP__SOCKIO_H */
