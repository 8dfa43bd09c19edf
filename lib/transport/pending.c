/* pending.c - the connections a listener accepted, read side by side until each presents its
 * handshake or runs out of time (pending.h). */
#include "transport/pending.h"

#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/internal.h"

void hoop__pending_init(hoop__pending *pending) {
  pending->n = 0;
}

static void close_conn(hoop__pending_conn *conn) {
  if (conn->memfd >= 0)
    close(conn->memfd);
  if (conn->fd >= 0)
    close(conn->fd);
  conn->fd = conn->memfd = -1;
}

void hoop__pending_refuse(hoop__pending_conn *conn, const char *name, const char *why) {
  static atomic_int warned;
  if (!atomic_exchange(&warned, 1))
    HOOP__WARN(HOOP_SUBSYS_NET,
               "%s: refused a connection that did not present this job's handshake (from %s: %s); "
               "HOOP_DEBUG=info logs each one",
               name, conn->from, why);
  else
    HOOP__INFO(HOOP_SUBSYS_NET,
               "%s: refused a connection that did not present this job's handshake (from %s: %s)",
               name, conn->from, why);
  close_conn(conn);
}

void hoop__pending_close(hoop__pending *pending) {
  for (int i = 0; i < pending->n; i++)
    close_conn(&pending->conn[i]);
  pending->n = 0;
}

/* Take conn i out of the set (the last one fills its place). */
static void take_out(hoop__pending *pending, int i) {
  pending->conn[i] = pending->conn[--pending->n];
}

/* Connections of the set from one place (from NULL: all), and the oldest of them that may be
 * dropped (short of a handshake for HOOP__PENDING_GRACE_S), -1 when none may. */
static int droppable(const hoop__pending *pending, const char *from, double now, int *count) {
  int found = -1;
  *count = 0;
  for (int i = 0; i < pending->n; i++) {
    const hoop__pending_conn *c = &pending->conn[i];
    if (from && strcmp(c->from, from) != 0)
      continue;
    (*count)++;
    double waited = now - (c->deadline - HOOP__PENDING_WAIT_S);
    if (!c->whole && waited >= HOOP__PENDING_GRACE_S &&
        (found < 0 || c->deadline < pending->conn[found].deadline))
      found = i;
  }
  return found;
}

/* Read what has come on waiting connection i: whole, it is marked (handed out next); refused, it
 * is closed and taken out (the last one takes its place: callers go from the end). */
static void read_one(hoop__pending *pending, const hoop__pending_ops *ops, int i) {
  char why[160];
  hoop__pending_conn *c = &pending->conn[i];
  if (c->whole)
    return;
  int whole = ops->read(c, ops->bytes, why, sizeof why);
  if (whole > 0) {
    c->whole = 1;
  } else if (whole < 0) {
    hoop__pending_refuse(c, ops->name, why);
    take_out(pending, i);
  }
}

/* Read what has come on every waiting connection. */
static void read_waiting(hoop__pending *pending, const hoop__pending_ops *ops) {
  for (int i = pending->n - 1; i >= 0; i--)
    read_one(pending, ops, i);
}

/* The oldest connection short of a handshake of the place that holds the most such, whatever
 * its age; -1 when every connection of the set has its handshake. */
static int busiest_oldest(const hoop__pending *pending) {
  int best = -1, best_count = 0;
  for (int i = 0; i < pending->n; i++) {
    const hoop__pending_conn *c = &pending->conn[i];
    if (c->whole)
      continue;
    int count = 0, oldest = -1;
    for (int j = 0; j < pending->n; j++) {
      const hoop__pending_conn *d = &pending->conn[j];
      if (d->whole || strcmp(d->from, c->from) != 0)
        continue;
      count++;
      if (oldest < 0 || d->deadline < pending->conn[oldest].deadline)
        oldest = j;
    }
    if (count > best_count) {
      best_count = count;
      best = oldest;
    }
  }
  return best;
}

/* A newly accepted connection whose handshake is not whole yet joins the set, making room. */
static void add(hoop__pending *pending, const hoop__pending_ops *ops, hoop__pending_conn *conn) {
  double now = hoop__now();
  int from_count, all_count;
  droppable(pending, conn->from, now, &from_count);
  if (from_count >= HOOP__PENDING_PER_FROM || pending->n == HOOP__PENDING_MAX) {
    read_waiting(pending, ops);
    int victim = droppable(pending, conn->from, now, &from_count);
    const char *why = "too many connections from there waiting at once: the oldest goes";
    if (from_count < HOOP__PENDING_PER_FROM || victim < 0) {
      victim = pending->n == HOOP__PENDING_MAX ? droppable(pending, NULL, now, &all_count) : -1;
      why = "too many connections waiting at once: the oldest goes";
    }
    /* Full, and none has waited long: a place opening connections faster than the grace (a
     * churning stranger) would otherwise keep every newcomer out. The place holding the most
     * gives up its oldest, as hoopd's server does; only a set of whole handshakes refuses. */
    if (victim < 0 && pending->n == HOOP__PENDING_MAX) {
      victim = busiest_oldest(pending);
      why = "too many connections waiting at once: the oldest of the place holding the most goes";
    }
    if (victim >= 0) {
      hoop__pending_refuse(&pending->conn[victim], ops->name, why);
      take_out(pending, victim);
    } else if (pending->n == HOOP__PENDING_MAX) {
      hoop__pending_refuse(conn, ops->name,
                           "too many connections waiting at once, every one with its handshake");
      return;
    }
  }
  pending->conn[pending->n++] = *conn;
}

/* The first whole connection of the set, taken out into *out: 1, or 0 when none is whole. */
static int take_whole(hoop__pending *pending, hoop__pending_conn *out) {
  for (int i = 0; i < pending->n; i++)
    if (pending->conn[i].whole) {
      *out = pending->conn[i];
      take_out(pending, i);
      return 1;
    }
  return 0;
}

/* Accept what the listener has (a bounded batch), reading each one's handshake at once: 1 with a
 * whole one in *out, 0 when none, or a failure of accept. */
static int accept_batch(hoop__tctx *ctx, hoop__pending *pending, const hoop__pending_ops *ops,
                        int listen_fd, hoop__pending_conn *out, hoop_result *result) {
  char why[160];
  for (int batch = 0; batch < HOOP__PENDING_MAX; batch++) {
    int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
        *result =
            hoop__fail(ctx->comm, HOOP_ERR_SYSTEM, "%s: accept: %s", ops->name, strerror(errno));
      return take_whole(pending, out);
    }
    hoop__pending_conn conn = {
        .fd = fd, .memfd = -1, .deadline = hoop__now() + HOOP__PENDING_WAIT_S};
    snprintf(conn.from, sizeof conn.from, "?");
    if (ops->admit(&conn, why, sizeof why) != 0) {
      hoop__pending_refuse(&conn, ops->name, why);
      continue;
    }
    int whole = ops->read(&conn, ops->bytes, why, sizeof why);
    if (whole > 0) {
      *out = conn;
      return 1;
    }
    if (whole < 0)
      hoop__pending_refuse(&conn, ops->name, why);
    else
      add(pending, ops, &conn);
  }
  return take_whole(pending, out);
}

hoop_result hoop__pending_accept(hoop__tctx *ctx, hoop__pending *pending,
                                 const hoop__pending_ops *ops, int listen_fd, int wake_fd,
                                 double deadline, hoop__pending_conn *out) {
  struct pollfd pfds[3 + HOOP__PENDING_MAX];
  char why[160];
  for (;;) {
    if (take_whole(pending, out))
      return HOOP_OK;
    /* A failed transport listens no more (its shutdown closed the socket): the peer this rank
     * waits for will never come, and nothing in the poll below would say so before the timeout. */
    if (*ctx->failed)
      return *ctx->failed;
    double now = hoop__now(), until = deadline;
    for (int i = 0; i < pending->n; i++) {
      if (pending->conn[i].deadline <= now) {
        snprintf(why, sizeof why, "no whole handshake within %.0f s", HOOP__PENDING_WAIT_S);
        hoop__pending_refuse(&pending->conn[i], ops->name, why);
        take_out(pending, i--);
      } else if (pending->conn[i].deadline < until) {
        until = pending->conn[i].deadline;
      }
    }
    if (now >= deadline)
      return HOOP_ERR_TIMEOUT;
    pfds[0] = (struct pollfd){.fd = listen_fd, .events = POLLIN};
    pfds[1] = (struct pollfd){.fd = wake_fd, .events = POLLIN};
    pfds[2] = (struct pollfd){.fd = *ctx->watch_fd, .events = POLLIN};
    int n = pending->n;
    for (int i = 0; i < n; i++)
      pfds[3 + i] = (struct pollfd){.fd = pending->conn[i].fd, .events = POLLIN};
    double left = until - now;
    int ready = poll(pfds, (nfds_t)(3 + n), left > 0.1 ? 100 : (int)(left * 1000) + 1);
    if (ready < 0 && errno != EINTR)
      return hoop__fail(ctx->comm, HOOP_ERR_SYSTEM, "%s: poll: %s", ops->name, strerror(errno));
    if (ready <= 0)
      continue;
    hoop_result result = HOOP_OK;
    if (pfds[1].revents) {
      if ((result = hoop__wake_drain(ctx, wake_fd, ops->name)) != HOOP_OK)
        return result;
      result = hoop__check_abort(ctx->comm);
    }
    if (result == HOOP_OK && pfds[2].revents)
      result = hoop__tctx_watched(ctx);
    if (result != HOOP_OK || *ctx->failed)
      return result != HOOP_OK ? result : *ctx->failed;
    /* The waiting ones first, by their place in this poll set (taking one out moves the last). */
    for (int i = n - 1; i >= 0; i--)
      if (pfds[3 + i].revents)
        read_one(pending, ops, i);
    if (take_whole(pending, out))
      return HOOP_OK;
    if (pfds[0].revents && accept_batch(ctx, pending, ops, listen_fd, out, &result))
      return HOOP_OK;
    if (result != HOOP_OK)
      return result;
  }
}
