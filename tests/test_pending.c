/* test_pending.c - a listener's waiting handshakes (lib/transport/pending.c) over real loopback
 * sockets: a set filled by one place with silent connections younger than the grace still makes
 * room for a newcomer whose handshake comes a moment after its connection (the oldest of the
 * busiest place goes); a set of whole handshakes refuses it; whole handshakes are handed out
 * first. */
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/pending.h"

#define HANDSHAKE "handshak"

static int admit(hoop__pending_conn *conn, char *why, size_t whylen) {
  (void)why;
  (void)whylen;
  snprintf(conn->from, sizeof conn->from, "127.0.0.1");
  return 0;
}

static int read_some(hoop__pending_conn *conn, size_t bytes, char *why, size_t whylen) {
  while (conn->got < bytes) {
    ssize_t n = recv(conn->fd, conn->buf + conn->got, bytes - conn->got, MSG_DONTWAIT);
    if (n > 0) {
      conn->got += (size_t)n;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
      return 0;
    snprintf(why, whylen, "closed");
    return -1;
  }
  return 1;
}

static const hoop__pending_ops ops = {"test", sizeof HANDSHAKE - 1, admit, read_some};

typedef struct listener {
  int fd, wake, watch;
  struct sockaddr_in addr;
  hoop_result failed;
  hoop__tctx ctx;
  hoop__pending pending;
} listener;

static void open_listener(listener *l) {
  memset(l, 0, sizeof *l);
  l->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  l->addr = (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof l->addr;
  ck_assert_int_eq(bind(l->fd, (struct sockaddr *)&l->addr, sizeof l->addr), 0);
  ck_assert_int_eq(listen(l->fd, 512), 0);
  ck_assert_int_eq(getsockname(l->fd, (struct sockaddr *)&l->addr, &len), 0);
  l->wake = eventfd(0, EFD_NONBLOCK);
  l->watch = -1;
  l->ctx = (hoop__tctx){.watch_fd = &l->watch, .failed = &l->failed};
  hoop__pending_init(&l->pending);
}

static int connect_to(const listener *l) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ck_assert_int_eq(connect(fd, (const struct sockaddr *)&l->addr, sizeof l->addr), 0);
  return fd;
}

static hoop_result accept_for(listener *l, double seconds, hoop__pending_conn *out) {
  return hoop__pending_accept(&l->ctx, &l->pending, &ops, l->fd, l->wake, hoop__now() + seconds,
                              out);
}

/* Whether the connection fd was closed by the other end (read at once, without waiting). */
static int closed_by_listener(int fd) {
  char byte;
  ssize_t n = recv(fd, &byte, 1, MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

START_TEST(test_churning_place_gives_way) {
  listener l;
  open_listener(&l);
  int silent[HOOP__PENDING_MAX];
  for (int i = 0; i < HOOP__PENDING_MAX; i++)
    silent[i] = connect_to(&l);
  hoop__pending_conn out;
  /* All taken into the set, none whole, all younger than the grace. */
  ck_assert_int_eq(accept_for(&l, 0.3, &out), HOOP_ERR_TIMEOUT);
  ck_assert_int_eq(l.pending.n, HOOP__PENDING_MAX);
  /* A peer whose handshake is a moment late: it takes a place (before, it was refused). */
  int peer = connect_to(&l);
  ck_assert_int_eq(accept_for(&l, 0.2, &out), HOOP_ERR_TIMEOUT);
  ck_assert(!closed_by_listener(peer));
  ck_assert_int_eq(send(peer, HANDSHAKE, sizeof HANDSHAKE - 1, 0), (ssize_t)sizeof HANDSHAKE - 1);
  ck_assert_int_eq(accept_for(&l, 2.0, &out), HOOP_OK);
  ck_assert(memcmp(out.buf, HANDSHAKE, sizeof HANDSHAKE - 1) == 0);
  close(out.fd);
  int dropped = 0;
  for (int i = 0; i < HOOP__PENDING_MAX; i++) {
    dropped += closed_by_listener(silent[i]);
    close(silent[i]);
  }
  ck_assert_int_eq(dropped, 1); /* the oldest silent one went for it */
  close(peer);
  hoop__pending_close(&l.pending);
  close(l.fd);
  close(l.wake);
}
END_TEST

/* Whole handshakes are never dropped: connections whose handshakes all came are handed out one
 * by one, in the order asked, and a silent one is refused at its deadline, not before. */
START_TEST(test_whole_first) {
  listener l;
  open_listener(&l);
  int quiet = connect_to(&l);
  int peers[3];
  for (int i = 0; i < 3; i++) {
    peers[i] = connect_to(&l);
    ck_assert_int_eq(send(peers[i], HANDSHAKE, sizeof HANDSHAKE - 1, 0),
                     (ssize_t)sizeof HANDSHAKE - 1);
  }
  hoop__pending_conn out;
  for (int i = 0; i < 3; i++) {
    ck_assert_int_eq(accept_for(&l, 2.0, &out), HOOP_OK);
    close(out.fd);
  }
  ck_assert_int_eq(l.pending.n, 1);
  ck_assert(!closed_by_listener(quiet));
  for (int i = 0; i < 3; i++)
    close(peers[i]);
  close(quiet);
  hoop__pending_close(&l.pending);
  close(l.fd);
  close(l.wake);
}
END_TEST

int main(void) {
  Suite *s = suite_create("pending");
  TCase *tc = tcase_create("handshakes");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_churning_place_gives_way);
  tcase_add_test(tc, test_whole_first);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
