/* pending.h - connections accepted on a transport's listener whose handshake has not all come in.
 *
 * Each has its own deadline and is read as its bytes arrive, so that strangers who connect and say
 * nothing (or trickle) never hold up a real peer, whose handshake is read the moment it is
 * accepted. Before, an accept read each connection's handshake in turn, waiting up to 5 s on
 * each: a few silent connections queued ahead of a peer made hoop_init time out. At most
 * HOOP__PENDING_MAX wait at once, and HOOP__PENDING_PER_FROM from one address (TCP) or process
 * (shared memory): past either, the waiting ones are read once more, and the oldest of those
 * still short of a handshake after HOOP__PENDING_GRACE_S is dropped for the newcomer. A real
 * peer's handshake follows its connection at once, so a burst of real peers (many ranks of one
 * host) is never dropped: with none old enough to drop, the set grows to HOOP__PENDING_MAX. Past
 * that, the place holding the most connections short of a handshake gives up its oldest, whatever
 * its age (a stranger churning connections faster than the grace would otherwise keep every real
 * peer out), and only a set of whole handshakes refuses the newcomer. Every refusal is logged at
 * info with where it came from; the first of a process also as a warning. */
#ifndef HOOP__TRANSPORT_PENDING_H
#define HOOP__TRANSPORT_PENDING_H

#include <stddef.h>
#include <stdint.h>

#include "transport/transport.h"

#define HOOP__PENDING_MAX 64
#define HOOP__PENDING_PER_FROM 16
#define HOOP__PENDING_GRACE_S 1.0 /* short of a handshake this long: may be dropped */
#define HOOP__PENDING_BYTES 64    /* the longest handshake a transport reads */
#define HOOP__PENDING_WAIT_S 5.0  /* for the whole handshake, from the accept */

typedef struct hoop__pending_conn {
  int fd;
  int memfd; /* shared memory: the descriptor the hello brought, or -1 */
  double deadline;
  size_t got;
  int whole; /* its handshake is all in: the next to be handed out, never dropped */
  uint8_t buf[HOOP__PENDING_BYTES];
  char from[64]; /* the peer's address (TCP) or "pid N" (shared memory) */
} hoop__pending_conn;

typedef struct hoop__pending_ops {
  const char *name; /* "tcp", "shm": for the log */
  size_t bytes;     /* the handshake's length, at most HOOP__PENDING_BYTES */
  /* Just accepted: fill conn->from; 0 to read it, or -1 to refuse it at once (why in why). */
  int (*admit)(hoop__pending_conn *conn, char *why, size_t whylen);
  /* Read what has come, without blocking: 1 when whole, 0 when more is to come, -1 to refuse it
   * (why in why: closed, an error, descriptors it should not have sent). */
  int (*read)(hoop__pending_conn *conn, size_t bytes, char *why, size_t whylen);
} hoop__pending_ops;

typedef struct hoop__pending {
  hoop__pending_conn conn[HOOP__PENDING_MAX];
  int n;
} hoop__pending;

void hoop__pending_init(hoop__pending *pending);

/* Accept and read until one connection has presented a whole handshake: HOOP_OK with it in *out,
 * out of the set (the caller owns its fd and memfd, and checks the bytes). HOOP_ERR_TIMEOUT at
 * deadline; a failure or abort seen on the wake or watch descriptors as hoop__wait_listener
 * returns it. */
hoop_result hoop__pending_accept(hoop__tctx *ctx, hoop__pending *pending,
                                 const hoop__pending_ops *ops, int listen_fd, int wake_fd,
                                 double deadline, hoop__pending_conn *out);

/* Close a connection that did not present what it should, and log why with where it came from. */
void hoop__pending_refuse(hoop__pending_conn *conn, const char *name, const char *why);

/* Close every connection still waiting (the transport is closing). */
void hoop__pending_close(hoop__pending *pending);

#endif /* HOOP__TRANSPORT_PENDING_H */
