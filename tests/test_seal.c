/* test_seal.c - HOOP_ENCRYPT's records (transports/tcp/seal.c) over real sockets: every size
 * through both ciphers, non-blocking both ways; a record changed, replayed, reordered, cut short
 * or sealed with another key fails with EBADMSG and delivers nothing; plaintext a record brought
 * beyond what a receive asked for waits in the seal, where poll() cannot see it. The carrier
 * between the two seals is a man in the middle: what one end writes is read raw, changed or not,
 * and written to the other end's socket. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../transports/tcp/seal.h"

typedef struct wire {
  int send_fd, tap_fd;    /* the sender's end and the middle's end of the first pair */
  int inject_fd, recv_fd; /* the middle's end and the receiver's end of the second */
  hoop__seal tx, rx;
} wire;

static const char *cipher_names[] = {"aes256gcm", "chacha20poly1305"};

static void nonblocking(int fd) {
  ck_assert_int_eq(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
}

/* Two seals with matching keys (rx_other: the receiver's key differs). 0, or 1 when the cipher is
 * not available on this CPU (AES-256-GCM needs AES instructions). */
static int open_wire(wire *w, int which, int rx_other) {
  hoop__cipher cipher;
  const char *why;
  if (hoop__seal_choose(cipher_names[which], &cipher, &why) != 0) {
#if defined(__x86_64__)
    /* Every x86-64 CPU hoop runs on has AES-NI: its absence here is a fault to see. */
    ck_abort_msg("%s: %s", cipher_names[which], why);
#endif
    return 1;
  }
  int a[2], b[2];
  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, a), 0);
  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, b), 0);
  *w = (wire){.send_fd = a[0], .tap_fd = a[1], .inject_fd = b[0], .recv_fd = b[1]};
  nonblocking(w->send_fd);
  nonblocking(w->recv_fd);
  nonblocking(w->tap_fd);
  uint8_t one[HOOP__SEAL_KEY], two[HOOP__SEAL_KEY], three[HOOP__SEAL_KEY];
  memset(one, 0x11, sizeof one);
  memset(two, 0x22, sizeof two);
  memset(three, 0x33, sizeof three);
  ck_assert_int_eq(hoop__seal_init(&w->tx, cipher, one, two), 0);
  ck_assert_int_eq(hoop__seal_init(&w->rx, cipher, two, rx_other ? three : one), 0);
  return 0;
}

static void close_wire(wire *w) {
  close(w->send_fd);
  close(w->tap_fd);
  close(w->inject_fd);
  close(w->recv_fd);
  hoop__seal_free(&w->tx);
  hoop__seal_free(&w->rx);
}

/* Everything the middle has from the sender, raw, appended to *buf (grown). */
static size_t tap(wire *w, uint8_t **buf, size_t have) {
  for (;;) {
    *buf = realloc(*buf, have + 65536);
    ssize_t n = recv(w->tap_fd, *buf + have, 65536, 0);
    if (n <= 0)
      return have;
    have += (size_t)n;
  }
}

static void inject(wire *w, const uint8_t *bytes, size_t len) {
  for (size_t done = 0; done < len;) {
    ssize_t n = send(w->inject_fd, bytes + done, len - done, MSG_NOSIGNAL);
    ck_assert(n > 0);
    done += (size_t)n;
  }
}

/* Seal all of len bytes at data into the middle's hands: the raw bytes, their length in *raw_len.
 */
static uint8_t *seal_all(wire *w, const uint8_t *data, size_t len, size_t *raw_len) {
  uint8_t *raw = NULL;
  size_t have = 0, sent = 0;
  while (sent < len) {
    struct iovec iov = {(void *)(data + sent), len - sent};
    ssize_t n = hoop__seal_send(&w->tx, w->send_fd, &iov, 1);
    if (n > 0)
      sent += (size_t)n;
    else
      ck_assert_msg(n < 0 && errno == EAGAIN, "seal_send: %s", strerror(errno));
    have = tap(w, &raw, have);
  }
  *raw_len = have;
  return raw;
}

/* Receive up to len bytes into out, in pieces of at most piece bytes; the count, or -1 with the
 * errno of the failure in *err. */
static ssize_t open_all(wire *w, uint8_t *out, size_t len, size_t piece, int *err) {
  size_t got = 0;
  while (got < len) {
    struct iovec iov = {out + got, len - got < piece ? len - got : piece};
    ssize_t n = hoop__seal_recv(&w->rx, w->recv_fd, &iov, 1);
    if (n < 0 && errno == EAGAIN)
      break;
    if (n <= 0) {
      *err = n < 0 ? errno : 0;
      return n < 0 ? -1 : (ssize_t)got;
    }
    got += (size_t)n;
  }
  return (ssize_t)got;
}

/* The raw bytes written to the receiver as its socket takes them, while it receives. */
static ssize_t deliver(wire *w, const uint8_t *raw, size_t raw_len, uint8_t *out, size_t len,
                       size_t piece, int *err) {
  size_t injected = 0, got = 0;
  for (int idle = 0; got < len && idle < 1000;) {
    ssize_t n = injected < raw_len ? send(w->inject_fd, raw + injected, raw_len - injected,
                                          MSG_NOSIGNAL | MSG_DONTWAIT)
                                   : 0;
    if (n > 0)
      injected += (size_t)n;
    ssize_t m = open_all(w, out + got, len - got, piece, err);
    if (m < 0)
      return -1;
    got += (size_t)m;
    idle = n > 0 || m > 0 ? 0 : idle + 1;
  }
  return (ssize_t)got;
}

static uint8_t *pattern(size_t len, unsigned seed) {
  uint8_t *data = malloc(len ? len : 1);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < len; i++) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    data[i] = (uint8_t)x;
  }
  return data;
}

/* Every size, whole and in small pieces, through the middle unchanged; the bytes on the wire are
 * not the plaintext's. */
START_TEST(test_round_trip) {
  static const size_t sizes[] = {1, 15, 16, 17, 4095, 65535, 65536, 65537, 200000, 1 << 20};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    wire w;
    if (open_wire(&w, _i, 0))
      return;
    size_t len = sizes[s], raw_len;
    uint8_t *data = pattern(len, (unsigned)s), *out = calloc(len, 1);
    uint8_t *raw = seal_all(&w, data, len, &raw_len);
    size_t records = (len + HOOP__SEAL_RECORD - 1) / HOOP__SEAL_RECORD;
    ck_assert_uint_eq(raw_len, len + records * (4 + HOOP__SEAL_TAG));
    if (len >= 16)
      ck_assert_msg(memmem(raw, raw_len, data, 16) == NULL, "plaintext on the wire");
    int err = 0;
    ck_assert_int_eq(deliver(&w, raw, raw_len, out, len, s % 2 ? 1000 : len, &err), (ssize_t)len);
    ck_assert(memcmp(out, data, len) == 0);
    ck_assert(!hoop__seal_buffered(&w.rx));
    free(data);
    free(out);
    free(raw);
    close_wire(&w);
  }
}
END_TEST

/* One byte changed anywhere in a record (its length, its text, its tag): the receive fails with
 * EBADMSG, nothing of the record reaches the buffer, and every later receive fails too. */
START_TEST(test_tampered) {
  size_t len = 3000, raw_len;
  size_t places[] = {1, 4, 100, 4 + 3000 - 1, 4 + 3000 + 5};
  for (size_t p = 0; p < sizeof places / sizeof places[0]; p++) {
    wire w;
    if (open_wire(&w, _i, 0))
      return;
    uint8_t *data = pattern(len, 9), *out = calloc(len, 1);
    uint8_t *raw = seal_all(&w, data, len, &raw_len);
    raw[places[p]] ^= 0x40;
    inject(&w, raw, raw_len);
    int err = 0;
    ck_assert_int_eq(open_all(&w, out, len, len, &err), -1);
    ck_assert_int_eq(err, EBADMSG);
    for (size_t i = 0; i < len; i++)
      ck_assert_msg(out[i] == 0, "a byte of a tampered record was delivered");
    struct iovec iov = {out, len};
    ck_assert_int_eq(hoop__seal_recv(&w.rx, w.recv_fd, &iov, 1), -1);
    ck_assert_int_eq(errno, EBADMSG);
    free(data);
    free(out);
    free(raw);
    close_wire(&w);
  }
}
END_TEST

/* Two records: the first delivered twice (replayed), or the second before the first (reordered),
 * or the first dropped: the out-of-turn record fails. */
START_TEST(test_replayed_reordered_dropped) {
  for (int attack = 0; attack < 3; attack++) {
    wire w;
    if (open_wire(&w, _i, 0))
      return;
    uint8_t *first = pattern(100, 1), *second = pattern(100, 2), out[200] = {0};
    size_t one_len, two_len;
    uint8_t *one = seal_all(&w, first, 100, &one_len);
    uint8_t *two = seal_all(&w, second, 100, &two_len);
    int err = 0;
    if (attack == 0) { /* replayed: the first, then the first again */
      inject(&w, one, one_len);
      inject(&w, one, one_len);
      ck_assert_int_eq(open_all(&w, out, 100, 100, &err), 100);
      ck_assert(memcmp(out, first, 100) == 0);
      ck_assert_int_eq(open_all(&w, out + 100, 100, 100, &err), -1);
    } else if (attack == 1) { /* reordered */
      inject(&w, two, two_len);
      inject(&w, one, one_len);
      ck_assert_int_eq(open_all(&w, out, 100, 100, &err), -1);
    } else { /* the first dropped */
      inject(&w, two, two_len);
      ck_assert_int_eq(open_all(&w, out, 100, 100, &err), -1);
    }
    ck_assert_int_eq(err, EBADMSG);
    free(first);
    free(second);
    free(one);
    free(two);
    close_wire(&w);
  }
}
END_TEST

/* A receiver holding another key (another pair, another connection) opens nothing; a record's
 * length past the limit is refused before any of it is read. */
START_TEST(test_other_key_and_length) {
  wire w;
  if (open_wire(&w, _i, 1))
    return;
  uint8_t *data = pattern(64, 3), out[64] = {0};
  size_t raw_len;
  uint8_t *raw = seal_all(&w, data, 64, &raw_len);
  inject(&w, raw, raw_len);
  int err = 0;
  ck_assert_int_eq(open_all(&w, out, 64, 64, &err), -1);
  ck_assert_int_eq(err, EBADMSG);
  free(raw);
  close_wire(&w);

  ck_assert_int_eq(open_wire(&w, _i, 0), 0);
  uint8_t huge[8] = {0x7f, 0xff, 0xff, 0xff, 1, 2, 3, 4};
  inject(&w, huge, sizeof huge);
  ck_assert_int_eq(open_all(&w, out, 64, 64, &err), -1);
  ck_assert_int_eq(err, EBADMSG);
  free(data);
  close_wire(&w);
}
END_TEST

/* A receive that asks for less than a record brought leaves the rest in the seal: the socket is
 * no longer readable, and the seal says it holds bytes, which the next receives give. A send the
 * kernel cannot take whole says EAGAIN until all of its record is written, then counts it. */
START_TEST(test_buffered_and_partial) {
  wire w;
  if (open_wire(&w, _i, 0))
    return;
  uint8_t *data = pattern(1000, 4), out[1000] = {0};
  size_t raw_len;
  uint8_t *raw = seal_all(&w, data, 1000, &raw_len);
  inject(&w, raw, raw_len);
  int err = 0;
  ck_assert_int_eq(open_all(&w, out, 10, 10, &err), 10);
  struct pollfd pfd = {.fd = w.recv_fd, .events = POLLIN};
  ck_assert_int_eq(poll(&pfd, 1, 0), 0);
  ck_assert(hoop__seal_buffered(&w.rx));
  ck_assert_int_eq(open_all(&w, out + 10, 990, 990, &err), 990);
  ck_assert(memcmp(out, data, 1000) == 0);
  ck_assert(!hoop__seal_buffered(&w.rx));
  free(raw);
  free(data);

  /* The sender's socket full: its record half written, the call says EAGAIN, and the next one
   * (offering the same bytes) finishes it and counts it. */
  int small = 4096;
  setsockopt(w.send_fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
  uint8_t *big = pattern(HOOP__SEAL_RECORD, 5), *back = calloc(HOOP__SEAL_RECORD, 1);
  struct iovec iov = {big, HOOP__SEAL_RECORD};
  ck_assert_int_eq(hoop__seal_send(&w.tx, w.send_fd, &iov, 1), -1);
  ck_assert_int_eq(errno, EAGAIN);
  ck_assert(w.tx.out_done > 0 && w.tx.out_done < w.tx.out_len);
  uint8_t *moved = NULL;
  size_t have = 0;
  ssize_t counted = -1;
  for (int round = 0; round < 10000 && counted < 0; round++) {
    have = tap(&w, &moved, have);
    counted = hoop__seal_send(&w.tx, w.send_fd, &iov, 1);
    ck_assert(counted > 0 || errno == EAGAIN);
  }
  ck_assert_int_eq(counted, HOOP__SEAL_RECORD);
  have = tap(&w, &moved, have);
  inject(&w, moved, have);
  ck_assert_int_eq(open_all(&w, back, HOOP__SEAL_RECORD, HOOP__SEAL_RECORD, &err),
                   HOOP__SEAL_RECORD);
  ck_assert(memcmp(back, big, HOOP__SEAL_RECORD) == 0);
  free(big);
  free(back);
  free(moved);
  close_wire(&w);
}
END_TEST

/* HOOP_ENCRYPT's values. */
START_TEST(test_choose) {
  hoop__cipher cipher;
  const char *why;
  ck_assert_int_eq(hoop__seal_choose("0", &cipher, &why), 0);
  ck_assert_int_eq(cipher, HOOP__CIPHER_NONE);
  ck_assert_int_eq(hoop__seal_choose("1", &cipher, &why), 0);
  ck_assert(cipher == HOOP__CIPHER_AES256GCM || cipher == HOOP__CIPHER_CHACHA20POLY1305);
  ck_assert_int_eq(hoop__seal_choose("chacha20poly1305", &cipher, &why), 0);
  ck_assert_int_eq(cipher, HOOP__CIPHER_CHACHA20POLY1305);
  ck_assert_int_eq(hoop__seal_choose("rot13", &cipher, &why), -1);
  ck_assert_ptr_nonnull(strstr(why, "aes256gcm"));
}
END_TEST

int main(void) {
  Suite *s = suite_create("seal");
  TCase *tc = tcase_create("records");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_round_trip, 0, 2);
  tcase_add_loop_test(tc, test_tampered, 0, 2);
  tcase_add_loop_test(tc, test_replayed_reordered_dropped, 0, 2);
  tcase_add_loop_test(tc, test_other_key_and_length, 0, 2);
  tcase_add_loop_test(tc, test_buffered_and_partial, 0, 2);
  tcase_add_test(tc, test_choose);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
