/* test_rdzv.c - the rendezvous server seen from raw client sockets: rank assignment by host,
 * requested ranks, refusals, timeouts, members leaving, malformed input, status, limits, `once`,
 * IPv6 and stopping. Clients claim host names of their own, which real ranks on one machine cannot.
 */
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "hoop.h"
#include "proto/auth.h"
#include "proto/wire.h"
#include "rdzv/server.h"
#include "transport/transport.h"
#include "util/be.h"

/* Every blocking socket call gives up after this long, so that a server bug fails a test instead
 * of hanging it. */
#define DEADLINE_MS 5000
/* The timeout of jobs that must not time out during a test. */
#define JOB_TIMEOUT_MS 20000
#define MAX_CLIENTS 16

/* ---- the server under test ------------------------------------------------------------------ */

static hoop__rdzv_thread *server;
static int server_port;
static int server_v6;

static void start_server(const hoop__rdzv_options *options) {
  char err[256] = "";
  int rc = hoop__rdzv_thread_start(options, &server, err, sizeof err);
  ck_assert_msg(rc == 0, "starting a server on %s: expected 0, got %d: %s", options->listen, rc,
                err);
  server_port = hoop__rdzv_thread_port(server);
  server_v6 = options->listen[0] == '[';
}

/* The fixture of most tests: a server with default limits on an IPv4 port of its own. */
static void start_default_server(void) {
  hoop__rdzv_options options = {.listen = "127.0.0.1:0"};
  start_server(&options);
}

static void stop_server(void) {
  hoop__rdzv_thread_stop(server);
  server = NULL;
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(unsigned ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---- sockets --------------------------------------------------------------------------------- */

/* A socket connected to the server, whose connect, sends and receives give up after DEADLINE_MS;
 * -1 with errno when the connection fails. */
static int try_connect(void) {
  int fd = socket(server_v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ck_assert_msg(fd >= 0, "socket: expected a descriptor, got %s", strerror(errno));
  struct timeval deadline = {DEADLINE_MS / 1000, (DEADLINE_MS % 1000) * 1000};
  ck_assert(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &deadline, sizeof deadline) == 0);
  ck_assert(setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &deadline, sizeof deadline) == 0);
  struct sockaddr_storage addr;
  socklen_t addrlen;
  memset(&addr, 0, sizeof addr);
  if (server_v6) {
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&addr;
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons((uint16_t)server_port);
    in6->sin6_addr = in6addr_loopback;
    addrlen = sizeof *in6;
  } else {
    struct sockaddr_in *in4 = (struct sockaddr_in *)&addr;
    in4->sin_family = AF_INET;
    in4->sin_port = htons((uint16_t)server_port);
    in4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addrlen = sizeof *in4;
  }
  if (connect(fd, (struct sockaddr *)&addr, addrlen) != 0) {
    int saved = errno;
    close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

static uint16_t read_message(int fd, uint8_t **payload, uint32_t *len, const char *who,
                             const char *expected);

/* The CHALLENGE of the last connection made by connect_server. */
static hoop__challenge last_challenge;

/* Connect and take the CHALLENGE that the server opens every connection with. */
static int connect_server(void) {
  int fd = try_connect();
  ck_assert_msg(fd >= 0, "connecting to port %d: expected success, got %s", server_port,
                strerror(errno));
  uint8_t *payload;
  uint32_t len;
  uint16_t type = read_message(fd, &payload, &len, "a new connection", "a CHALLENGE");
  int rc =
      type == HOOP_MSG_CHALLENGE ? hoop__wire_decode_challenge(payload, len, &last_challenge) : -1;
  free(payload);
  ck_assert_msg(rc == 0, "a new connection: expected a CHALLENGE first, got type %u", type);
  return fd;
}

/* MSG_NOSIGNAL: a server that closed the connection makes the send fail, not kill the test. */
static void send_bytes(int fd, const void *data, size_t len, const char *who) {
  const uint8_t *at = data;
  while (len > 0) {
    ssize_t n = send(fd, at, len, MSG_NOSIGNAL);
    ck_assert_msg(n > 0, "%s: sending %zu bytes: expected success, got %s", who, len,
                  strerror(errno));
    at += n;
    len -= (size_t)n;
  }
}

/* Read exactly len bytes: 0, or -1 with errno (0 when the server closed the connection). */
static int read_exact(int fd, void *buf, size_t len) {
  uint8_t *at = buf;
  while (len > 0) {
    ssize_t n = recv(fd, at, len, 0);
    if (n <= 0) {
      if (n == 0)
        errno = 0;
      return -1;
    }
    at += n;
    len -= (size_t)n;
  }
  return 0;
}

/* What a failed read_exact or recv met, for failure messages. */
static const char *read_failure(void) {
  if (errno == 0)
    return "the server closed the connection";
  if (errno == EAGAIN || errno == EWOULDBLOCK)
    return "nothing within the deadline";
  return strerror(errno);
}

static void expect_closed(int fd, const char *who) {
  uint8_t byte;
  ssize_t n = recv(fd, &byte, 1, 0);
  int closed = n == 0 || (n < 0 && errno == ECONNRESET);
  ck_assert_msg(closed, "%s: expected the server to close the connection, got %s", who,
                n > 0 ? "more bytes" : read_failure());
}

/* ---- messages -------------------------------------------------------------------------------- */

/* Read one whole message; returns its type, with its payload (malloc'ed) and length. */
static uint16_t read_message(int fd, uint8_t **payload, uint32_t *len, const char *who,
                             const char *expected) {
  uint8_t head[HOOP__WIRE_HEADER_SIZE];
  hoop__wire_header header;
  ck_assert_msg(read_exact(fd, head, sizeof head) == 0, "%s: expected %s, got %s", who, expected,
                read_failure());
  int rc = hoop__wire_decode_header(head, sizeof head, HOOP__WIRE_MAX_PAYLOAD, &header);
  ck_assert_msg(rc == 0, "%s: expected %s, got a header the decoder refuses (%d)", who, expected,
                rc);
  *payload = malloc(header.length ? header.length : 1);
  ck_assert_ptr_nonnull(*payload);
  *len = header.length;
  ck_assert_msg(read_exact(fd, *payload, header.length) == 0,
                "%s: expected %s, got the header of a %u-byte payload, then %s", who, expected,
                header.length, read_failure());
  return header.type;
}

/* A reply that is not the one expected, in words: "an ERROR (timeout): ...". */
static void describe_reply(uint16_t type, const uint8_t *payload, uint32_t len, char *out,
                           size_t outlen) {
  hoop__error_msg error;
  hoop__table table;
  if (type == HOOP_MSG_ERROR && hoop__wire_decode_error(payload, len, &error) == 0) {
    snprintf(out, outlen, "an ERROR (%s): %s", hoop_strerror((hoop_result)error.code),
             error.message);
  } else if (type == HOOP_MSG_TABLE && hoop__wire_decode_table(payload, len, &table) == 0) {
    snprintf(out, outlen, "a TABLE giving rank %u of %u", table.rank, table.size);
    hoop__table_free(&table);
  } else {
    snprintf(out, outlen, "a message of type %u (%u bytes) that does not decode as such", type,
             len);
  }
}

static void expect_table(int fd, hoop__table *table, const char *who) {
  uint8_t *payload;
  uint32_t len;
  char got[HOOP__WIRE_MAX_MESSAGE + 64];
  uint16_t type = read_message(fd, &payload, &len, who, "a TABLE");
  int rc = type == HOOP_MSG_TABLE ? hoop__wire_decode_table(payload, len, table) : -1;
  if (rc != 0)
    describe_reply(type, payload, len, got, sizeof got);
  free(payload);
  ck_assert_msg(rc == 0, "%s: expected a TABLE, got %s", who, got);
}

static void expect_error(int fd, hoop_result code, hoop__error_msg *error, const char *who) {
  uint8_t *payload;
  uint32_t len;
  char got[HOOP__WIRE_MAX_MESSAGE + 64];
  uint16_t type = read_message(fd, &payload, &len, who, "an ERROR");
  int rc = type == HOOP_MSG_ERROR ? hoop__wire_decode_error(payload, len, error) : -1;
  describe_reply(type, payload, len, got, sizeof got);
  free(payload);
  ck_assert_msg(rc == 0 && error->code == (uint32_t)code, "%s: expected an ERROR (%s), got %s", who,
                hoop_strerror(code), got);
}

static void expect_message_has(const hoop__error_msg *error, const char *part, const char *who) {
  ck_assert_msg(strstr(error->message, part) != NULL,
                "%s: expected an error message with '%s', got '%s'", who, part, error->message);
}

/* ---- joining --------------------------------------------------------------------------------- */

static hoop__hello hello_for(const char *job, uint32_t size, int32_t rank, const char *host,
                             const char *addr) {
  hoop__hello hello;
  memset(&hello, 0, sizeof hello);
  snprintf(hello.job, sizeof hello.job, "%s", job);
  hello.size = size;
  hello.rank = rank;
  hello.timeout_ms = JOB_TIMEOUT_MS;
  snprintf(hello.host, sizeof hello.host, "%s", host);
  snprintf(hello.addr, sizeof hello.addr, "%s", addr);
  return hello;
}

/* Send hello on fd, with the proof of token over the connection's challenge when token is not
 * NULL; its addr names the client in failure messages. */
static void send_hello_on(int fd, const hoop__hello *hello, const char *token) {
  hoop__hello sent = *hello;
  if (token) {
    sent.proof_len = HOOP__AUTH_PROOF;
    ck_assert_int_eq(hoop__auth_hello_proof(token, last_challenge.nonce, hello, sent.proof), 0);
  }
  hoop__wbuf wb = {0};
  ck_assert_msg(hoop__wire_encode_hello(&wb, &sent) == 0,
                "encoding the HELLO of %s: expected 0, got -1", hello->addr);
  send_bytes(fd, wb.data, wb.len, hello->addr);
  hoop__wbuf_free(&wb);
}

/* Connect and send hello (without a proof). */
static int send_hello(const hoop__hello *hello) {
  int fd = connect_server();
  send_hello_on(fd, hello, NULL);
  return fd;
}

static int join(const char *job, uint32_t size, int32_t rank, const char *host, const char *addr) {
  hoop__hello hello = hello_for(job, size, rank, host, addr);
  return send_hello(&hello);
}

/* ---- status ---------------------------------------------------------------------------------- */

/* A STATUS_REQ, with the proof of token (unless NULL) over the connection's challenge. */
static void send_status_req_as(int fd, const char *token) {
  hoop__status_req request = {0};
  if (token) {
    request.proof_len = HOOP__AUTH_PROOF;
    hoop__auth_proof(token, strlen(token), HOOP__AUTH_STATUS, last_challenge.nonce,
                     HOOP__WIRE_CHALLENGE, NULL, 0, request.proof);
  }
  hoop__wbuf wb = {0};
  ck_assert_int_eq(hoop__wire_encode_status_req(&wb, &request), 0);
  send_bytes(fd, wb.data, wb.len, "status query");
  hoop__wbuf_free(&wb);
}

static void send_status_req(int fd) {
  send_status_req_as(fd, NULL);
}

/* Ask for the status on a connection of its own, which the server then closes. */
static void query_status_as(hoop__status *status, const char *token) {
  int fd = connect_server();
  send_status_req_as(fd, token);
  uint8_t *payload;
  uint32_t len;
  char got[HOOP__WIRE_MAX_MESSAGE + 64];
  uint16_t type = read_message(fd, &payload, &len, "status query", "a STATUS");
  int rc = type == HOOP_MSG_STATUS ? hoop__wire_decode_status(payload, len, status) : -1;
  if (rc != 0)
    describe_reply(type, payload, len, got, sizeof got);
  free(payload);
  ck_assert_msg(rc == 0, "status query: expected a STATUS, got %s", got);
  expect_closed(fd, "status query");
  close(fd);
}

static void query_status(hoop__status *status) {
  query_status_as(status, NULL);
}

static const hoop__job_status *status_job(const hoop__status *status, const char *job) {
  for (uint32_t j = 0; j < status->njobs; j++)
    if (strcmp(status->jobs[j].job, job) == 0)
      return &status->jobs[j];
  return NULL;
}

/* A client that should be waiting for its job has had no reply, nor lost its connection. */
static void expect_no_reply(int fd, const char *who) {
  struct pollfd ready = {.fd = fd, .events = POLLIN};
  if (poll(&ready, 1, 0) == 0)
    return;
  uint8_t *payload;
  uint32_t len;
  char got[HOOP__WIRE_MAX_MESSAGE + 64];
  uint16_t type = read_message(fd, &payload, &len, who, "to wait for its job");
  describe_reply(type, payload, len, got, sizeof got);
  free(payload);
  ck_abort_msg("%s: expected to wait for its job, got %s", who, got);
}

/* Wait until the server counts `joined` ranks in job, the last of them the client on newcomer
 * (when not -1), or with joined 0 until it has forgotten the job. The next client then arrives
 * after those: the order of arrival decides the ranks not asked for. */
static void wait_member(const char *job, uint32_t joined, int newcomer, const char *who) {
  uint64_t start = now_ms();
  for (;;) {
    hoop__status status;
    query_status(&status);
    const hoop__job_status *waiting = status_job(&status, job);
    int listed = waiting != NULL;
    uint32_t seen = listed ? waiting->joined : 0;
    hoop__status_free(&status);
    if (joined > 0 ? seen == joined : !listed)
      return;
    if (newcomer >= 0)
      expect_no_reply(newcomer, who);
    ck_assert_msg(now_ms() - start < DEADLINE_MS,
                  "job '%s': expected %u ranks joined%s, still %u (%s) after %d ms", job, joined,
                  joined ? "" : " and the job forgotten", seen, listed ? "listed" : "not listed",
                  DEADLINE_MS);
    sleep_ms(1);
  }
}

static void wait_joined(const char *job, uint32_t joined) {
  wait_member(job, joined, -1, NULL);
}

/* ---- clients and the tables they expect ------------------------------------------------------ */

typedef struct client {
  const char *host;
  const char *addr;                      /* unique per client; also its name in failure messages */
  int32_t requested;                     /* the rank asked for, or -1 */
  uint32_t rank, local_rank, local_size; /* what the server should give it */
  int fd;
} client;

/* Join the n clients one after another, each once the server has counted the one before; `joined`
 * ranks are already waiting. The client that completes the job is not waited for. */
static void join_in_order(const char *job, uint32_t size, uint32_t joined, client *clients,
                          uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    clients[i].fd = join(job, size, clients[i].requested, clients[i].host, clients[i].addr);
    if (joined + i + 1 < size)
      wait_member(job, joined + i + 1, clients[i].fd, clients[i].addr);
  }
}

/* The table entry of each rank, as the clients describe it together. */
static void clients_by_rank(const client *clients, uint32_t n, const client **by_rank) {
  ck_assert_uint_le(n, MAX_CLIENTS);
  memset(by_rank, 0, n * sizeof *by_rank);
  for (uint32_t i = 0; i < n; i++) {
    ck_assert_msg(clients[i].rank < n && !by_rank[clients[i].rank],
                  "test setup: rank %u of %s is out of range or given twice", clients[i].rank,
                  clients[i].addr);
    by_rank[clients[i].rank] = &clients[i];
  }
}

static void check_table(const hoop__table *table, const client *self, const client **by_rank,
                        uint32_t size) {
  const char *who = self->addr;
  ck_assert_msg(table->size == size, "%s: expected a table of %u ranks, got %u", who, size,
                table->size);
  ck_assert_msg(table->rank == self->rank, "%s: expected rank %u, got %u", who, self->rank,
                table->rank);
  for (uint32_t r = 0; r < size; r++) {
    const hoop__peer_entry *got = &table->peers[r];
    const client *want = by_rank[r];
    ck_assert_msg(strcmp(got->addr, want->addr) == 0 && strcmp(got->host, want->host) == 0,
                  "%s: rank %u: expected %s on host %s, got %s on host %s", who, r, want->addr,
                  want->host, got->addr, got->host);
    ck_assert_msg(got->local_rank == want->local_rank && got->local_size == want->local_size,
                  "%s: rank %u (%s): expected local rank %u of %u, got %u of %u", who, r,
                  want->addr, want->local_rank, want->local_size, got->local_rank, got->local_size);
  }
}

/* A member leaves cleanly: BYE, then close. */
static void say_bye(int fd, const char *who) {
  hoop__wbuf out = {0};
  ck_assert_int_eq(hoop__wire_encode_bye(&out), 0);
  send_bytes(fd, out.data, out.len, who);
  hoop__wbuf_free(&out);
  close(fd);
}

/* Every client reads the table the clients describe, with its own rank and a nonce shared by all
 * (copied to nonce when not NULL); each connection stays open (a member keeps it), and each client
 * then leaves with a BYE. */
static void expect_tables(client *clients, uint32_t n, uint8_t *nonce) {
  const client *by_rank[MAX_CLIENTS];
  uint8_t first[HOOP__WIRE_NONCE];
  clients_by_rank(clients, n, by_rank);
  for (uint32_t i = 0; i < n; i++) {
    hoop__table table;
    expect_table(clients[i].fd, &table, clients[i].addr);
    check_table(&table, &clients[i], by_rank, n);
    if (i == 0)
      memcpy(first, table.nonce, sizeof first);
    ck_assert_msg(memcmp(first, table.nonce, sizeof first) == 0,
                  "%s: expected the nonce of %s, got another one", clients[i].addr,
                  clients[0].addr);
    hoop__table_free(&table);
    expect_no_reply(clients[i].fd, clients[i].addr);
  }
  for (uint32_t i = 0; i < n; i++)
    say_bye(clients[i].fd, clients[i].addr);
  uint8_t zero[HOOP__WIRE_NONCE] = {0};
  ck_assert_msg(memcmp(first, zero, sizeof zero) != 0, "nonce: expected random bytes, got zeros");
  if (nonce)
    memcpy(nonce, first, sizeof first);
}

/* ---- rank assignment ------------------------------------------------------------------------- */

/* Hosts arrive interleaved; each host's ranks come out contiguous, hosts in order of first
 * arrival, and within a host in order of arrival. */
START_TEST(test_hosts_get_contiguous_ranks) {
  client clients[] = {
      {"a", "a-0", -1, 0, 0, 3, -1}, {"b", "b-0", -1, 3, 0, 2, -1}, {"a", "a-1", -1, 1, 1, 3, -1},
      {"c", "c-0", -1, 5, 0, 1, -1}, {"b", "b-1", -1, 4, 1, 2, -1}, {"a", "a-2", -1, 2, 2, 3, -1},
  };
  join_in_order("interleaved", 6, 0, clients, 6);
  expect_tables(clients, 6, NULL);
}
END_TEST

/* Requested ranks are kept whatever the order of arrival; local ranks follow the ranks. */
START_TEST(test_requested_ranks_are_kept) {
  client clients[] = {
      {"x", "x-0", 3, 3, 1, 2, -1},
      {"y", "y-0", 0, 0, 0, 2, -1},
      {"x", "x-1", 1, 1, 0, 2, -1},
      {"y", "y-1", 2, 2, 1, 2, -1},
  };
  for (int i = 0; i < 4; i++)
    clients[i].fd = join("requested", 4, clients[i].requested, clients[i].host, clients[i].addr);
  expect_tables(clients, 4, NULL);
}
END_TEST

/* A requested rank is kept; the others fill the free ranks host by host. */
START_TEST(test_requested_and_assigned_mixed) {
  client clients[] = {
      {"x", "x-0", 1, 1, 0, 2, -1},
      {"y", "y-0", -1, 0, 0, 2, -1},
      {"x", "x-1", -1, 3, 1, 2, -1},
      {"y", "y-1", -1, 2, 1, 2, -1},
  };
  join_in_order("mixed", 4, 0, clients, 4);
  expect_tables(clients, 4, NULL);
}
END_TEST

/* ---- refusals -------------------------------------------------------------------------------- */

START_TEST(test_size_mismatch_refused) {
  client clients[] = {
      {"a", "a-0", -1, 0, 0, 1, -1},
      {"b", "b-0", -1, 1, 0, 1, -1},
      {"c", "c-0", -1, 2, 0, 1, -1},
  };
  join_in_order("sized", 3, 0, clients, 1);
  int wrong = join("sized", 5, -1, "d", "d-0");
  hoop__error_msg error;
  expect_error(wrong, HOOP_ERR_INVALID_ARG, &error, "d-0 (size 5 for a job of 3)");
  expect_message_has(&error, "job 'sized' has 3 ranks", "d-0");
  expect_message_has(&error, "says it has 5", "d-0");
  expect_closed(wrong, "d-0");
  close(wrong);
  join_in_order("sized", 3, 1, clients + 1, 2);
  expect_tables(clients, 3, NULL);
}
END_TEST

START_TEST(test_duplicate_rank_refused) {
  client clients[] = {
      {"a", "a-0", 1, 1, 0, 1, -1},
      {"b", "b-0", 0, 0, 0, 1, -1},
      {"c", "c-0", -1, 2, 0, 1, -1},
  };
  join_in_order("dup", 3, 0, clients, 1);
  int twin = join("dup", 3, 1, "d", "d-0");
  hoop__error_msg error;
  expect_error(twin, HOOP_ERR_INVALID_ARG, &error, "d-0 (rank 1 again)");
  expect_message_has(&error, "rank 1 of job 'dup' is already taken", "d-0");
  expect_closed(twin, "d-0");
  close(twin);
  join_in_order("dup", 3, 1, clients + 1, 2);
  expect_tables(clients, 3, NULL);
}
END_TEST

/* ---- timeouts -------------------------------------------------------------------------------- */

/* Every member asked for a rank: the message names the ranks that never came. */
START_TEST(test_timeout_names_missing_ranks) {
  uint64_t start = now_ms();
  hoop__hello hello = hello_for("slow", 4, 0, "a", "a-0");
  hello.timeout_ms = 500;
  int first = send_hello(&hello);
  hello = hello_for("slow", 4, 2, "b", "b-0");
  hello.timeout_ms = 500;
  int second = send_hello(&hello);
  int fds[2] = {first, second};
  const char *names[2] = {"a-0 (rank 0)", "b-0 (rank 2)"};
  for (int i = 0; i < 2; i++) {
    hoop__error_msg error;
    expect_error(fds[i], HOOP_ERR_TIMEOUT, &error, names[i]);
    expect_message_has(&error, "job 'slow' timed out after 0.5 s", names[i]);
    expect_message_has(&error, "2 of 4 ranks joined", names[i]);
    expect_message_has(&error, "missing ranks: 1, 3", names[i]);
    expect_closed(fds[i], names[i]);
    close(fds[i]);
  }
  uint64_t waited = now_ms() - start;
  ck_assert_msg(waited >= 450, "timeout: expected after about 500 ms, came after %llu ms",
                (unsigned long long)waited);
  hoop__status status;
  query_status(&status);
  ck_assert_msg(status.njobs == 0, "after the timeout: expected no job waiting, got %u",
                status.njobs);
  hoop__status_free(&status);
}
END_TEST

/* Nobody asked for a rank, so which are missing is unknown: the message names the hosts. */
START_TEST(test_timeout_names_joined_hosts) {
  const char *hosts[3] = {"h1", "h1", "h2"}, *addrs[3] = {"h1-0", "h1-1", "h2-0"};
  int fds[3];
  for (int i = 0; i < 3; i++) {
    hoop__hello hello = hello_for("hosts", 5, -1, hosts[i], addrs[i]);
    hello.timeout_ms = 300;
    fds[i] = send_hello(&hello);
    wait_joined("hosts", (uint32_t)i + 1);
  }
  for (int i = 0; i < 3; i++) {
    hoop__error_msg error;
    expect_error(fds[i], HOOP_ERR_TIMEOUT, &error, addrs[i]);
    expect_message_has(&error, "3 of 5 ranks joined; 2 ranks never joined", addrs[i]);
    expect_message_has(&error, "joined: h1 (2 ranks), h2 (1 rank)", addrs[i]);
    close(fds[i]);
  }
}
END_TEST

/* ---- members leaving ------------------------------------------------------------------------- */

/* A member that hangs up leaves the job; its requested rank is free for the next. */
START_TEST(test_leaving_member_is_replaced) {
  client clients[] = {
      {"a", "a-0", -1, 0, 0, 1, -1},
      {"c", "c-0", 1, 1, 0, 1, -1},
      {"d", "d-0", -1, 2, 0, 1, -1},
  };
  join_in_order("retry", 3, 0, clients, 1);
  int leaver = join("retry", 3, 1, "b", "b-0");
  wait_member("retry", 2, leaver, "b-0");
  close(leaver);
  wait_joined("retry", 1);
  join_in_order("retry", 3, 1, clients + 1, 2);
  expect_tables(clients, 3, NULL);
}
END_TEST

/* A job nobody waits for is forgotten, so that it may come back with another size. */
START_TEST(test_abandoned_job_is_forgotten) {
  int leaver = join("restart", 3, -1, "a", "a-0");
  wait_joined("restart", 1);
  close(leaver);
  wait_joined("restart", 0);
  client clients[] = {
      {"a", "a-1", -1, 0, 0, 1, -1},
      {"b", "b-0", -1, 1, 0, 1, -1},
  };
  join_in_order("restart", 2, 0, clients, 2);
  expect_tables(clients, 2, NULL);
}
END_TEST

/* A member sending anything after its HELLO is dropped from the job, and only it. */
START_TEST(test_bytes_after_hello_drop_that_member) {
  client clients[] = {
      {"a", "a-0", -1, 0, 0, 1, -1},
      {"c", "c-0", -1, 1, 0, 1, -1},
      {"d", "d-0", -1, 2, 0, 1, -1},
  };
  join_in_order("chatty", 3, 0, clients, 1);
  int chatty = join("chatty", 3, -1, "b", "b-0");
  wait_member("chatty", 2, chatty, "b-0");
  send_bytes(chatty, "x", 1, "b-0");
  expect_closed(chatty, "b-0 (a byte after its HELLO)");
  close(chatty);
  wait_joined("chatty", 1);
  join_in_order("chatty", 3, 1, clients + 1, 2);
  expect_tables(clients, 3, NULL);
}
END_TEST

/* ---- malformed requests ---------------------------------------------------------------------- */

static size_t header_bytes(uint8_t *out, uint32_t magic, uint16_t version, uint16_t type,
                           uint32_t length) {
  hoop__put_be32(out, magic);
  hoop__put_be16(out + 4, version);
  hoop__put_be16(out + 6, type);
  hoop__put_be32(out + 8, length);
  return HOOP__WIRE_HEADER_SIZE;
}

typedef struct bad_request {
  const char *what;
  uint8_t bytes[64];
  size_t len;
} bad_request;

static void fill_bad_requests(bad_request *bad, int *count) {
  int n = 0;
  const char http[] = "GET / HTTP/1.0\r\n\r\n";
  bad[n] = (bad_request){"an HTTP request", {0}, sizeof http - 1};
  memcpy(bad[n++].bytes, http, sizeof http - 1);
  bad[n].what = "a wrong magic";
  bad[n].len = header_bytes(bad[n].bytes, 0x4f4f4850u, HOOP__WIRE_VERSION, HOOP_MSG_STATUS_REQ, 0);
  n++;
  bad[n].what = "version 1 (before challenges)";
  bad[n].len = header_bytes(bad[n].bytes, HOOP__WIRE_MAGIC, 1, HOOP_MSG_STATUS_REQ, 0);
  n++;
  bad[n].what = "version 2 (little-endian)";
  bad[n].len = header_bytes(bad[n].bytes, HOOP__WIRE_MAGIC, 2, HOOP_MSG_STATUS_REQ, 0);
  n++;
  bad[n].what = "a later version";
  bad[n].len =
      header_bytes(bad[n].bytes, HOOP__WIRE_MAGIC, HOOP__WIRE_VERSION + 1, HOOP_MSG_STATUS_REQ, 2);
  bad[n].len += 2;
  n++;
  bad[n].what = "a length one byte over HOOP_WIRE_MAX_CLIENT_PAYLOAD";
  bad[n].len = header_bytes(bad[n].bytes, HOOP__WIRE_MAGIC, HOOP__WIRE_VERSION, HOOP_MSG_HELLO,
                            HOOP__WIRE_MAX_CLIENT_PAYLOAD + 1);
  n++;
  bad[n].what = "a length of 2 GiB";
  bad[n].len =
      header_bytes(bad[n].bytes, HOOP__WIRE_MAGIC, HOOP__WIRE_VERSION, HOOP_MSG_HELLO, 0x7fffffffu);
  n++;
  bad[n].what = "a TABLE, which only the server sends";
  bad[n].len = header_bytes(bad[n].bytes, HOOP__WIRE_MAGIC, HOOP__WIRE_VERSION, HOOP_MSG_TABLE, 0);
  n++;
  bad[n].what = "unknown type 99";
  bad[n].len = header_bytes(bad[n].bytes, HOOP__WIRE_MAGIC, HOOP__WIRE_VERSION, 99, 0);
  n++;
  bad[n].what = "a CHALLENGE, which only the server sends";
  bad[n].len = header_bytes(bad[n].bytes, HOOP__WIRE_MAGIC, HOOP__WIRE_VERSION, HOOP_MSG_CHALLENGE,
                            1 + HOOP__WIRE_CHALLENGE);
  bad[n].len += 1 + HOOP__WIRE_CHALLENGE;
  n++;
  bad[n].what = "a STATUS_REQ whose payload does not decode";
  bad[n].len =
      header_bytes(bad[n].bytes, HOOP__WIRE_MAGIC, HOOP__WIRE_VERSION, HOOP_MSG_STATUS_REQ, 1);
  bad[n].bytes[bad[n].len++] = 'x';
  n++;
  bad[n].what = "a STATUS_REQ with bytes past its proof";
  bad[n].len =
      header_bytes(bad[n].bytes, HOOP__WIRE_MAGIC, HOOP__WIRE_VERSION, HOOP_MSG_STATUS_REQ, 3);
  bad[n].len += 3;
  n++;
  bad[n].what = "a HELLO whose payload does not decode";
  bad[n].len = header_bytes(bad[n].bytes, HOOP__WIRE_MAGIC, HOOP__WIRE_VERSION, HOOP_MSG_HELLO, 3);
  memcpy(bad[n].bytes + bad[n].len, "abc", 3);
  bad[n++].len += 3;
  /* Sent in one write, so that the server reads both at once. */
  bad[n].what = "two STATUS_REQs on one connection";
  for (int i = 0; i < 2; i++) {
    bad[n].len += header_bytes(bad[n].bytes + bad[n].len, HOOP__WIRE_MAGIC, HOOP__WIRE_VERSION,
                               HOOP_MSG_STATUS_REQ, 2);
    bad[n].len += 2; /* an empty proof */
  }
  n++;
  *count = n;
}

/* Each bad request closes its own connection without a reply; a member waiting meanwhile stays,
 * and its job completes. */
START_TEST(test_malformed_requests_close_only_their_connection) {
  client clients[] = {
      {"a", "a-0", -1, 0, 0, 1, -1},
      {"b", "b-0", -1, 1, 0, 1, -1},
  };
  join_in_order("survivor", 2, 0, clients, 1);
  bad_request bad[16];
  memset(bad, 0, sizeof bad);
  int count;
  fill_bad_requests(bad, &count);
  for (int i = 0; i < count; i++) {
    int fd = connect_server();
    send_bytes(fd, bad[i].bytes, bad[i].len, bad[i].what);
    expect_closed(fd, bad[i].what);
    close(fd);
  }
  wait_joined("survivor", 1);
  join_in_order("survivor", 2, 1, clients + 1, 1);
  expect_tables(clients, 2, NULL);
}
END_TEST

/* ---- status ---------------------------------------------------------------------------------- */

/* Jobs are listed oldest first; missing ranks are known only when every member asked for one. */
START_TEST(test_status_lists_waiting_jobs) {
  int requested = join("waiting", 4, 3, "a", "a-0");
  wait_joined("waiting", 1);
  int unrequested = join("anywhere", 2, -1, "b", "b-0");
  wait_joined("anywhere", 1);
  sleep_ms(50);
  hoop__status status;
  query_status(&status);
  ck_assert_msg(status.njobs == 2, "expected 2 jobs waiting, got %u", status.njobs);
  const hoop__job_status *first = &status.jobs[0], *second = &status.jobs[1];
  ck_assert_msg(strcmp(first->job, "waiting") == 0 && strcmp(second->job, "anywhere") == 0,
                "expected jobs 'waiting' then 'anywhere', got '%s' then '%s'", first->job,
                second->job);
  ck_assert_msg(first->size == 4 && first->joined == 1,
                "'waiting': expected 1 of 4 joined, got %u of %u", first->joined, first->size);
  ck_assert_msg(first->nmissing == 3 && first->missing[0] == 0 && first->missing[1] == 1 &&
                    first->missing[2] == 2,
                "'waiting': expected missing ranks 0, 1, 2, got %u of them starting %d",
                first->nmissing, first->missing[0]);
  ck_assert_msg(first->waited_ms >= 40, "'waiting': expected a wait of 50 ms or more, got %u ms",
                first->waited_ms);
  ck_assert_msg(second->size == 2 && second->joined == 1 && second->nmissing == 0,
                "'anywhere': expected 1 of 2 joined, no missing ranks listed, got %u of %u and %u",
                second->joined, second->size, second->nmissing);
  ck_assert_msg(first->nhosts == 1 && strcmp(first->hosts[0].name, "a") == 0 &&
                    first->hosts[0].ranks == 1,
                "'waiting': expected host a with 1 rank, got %u hosts, the first '%s'",
                first->nhosts, first->nhosts ? first->hosts[0].name : "");
  ck_assert_msg(second->nhosts == 1 && strcmp(second->hosts[0].name, "b") == 0,
                "'anywhere': expected host b, got %u hosts", second->nhosts);
  hoop__status_free(&status);
  close(requested);
  close(unrequested);
  wait_joined("waiting", 0);
  wait_joined("anywhere", 0);
}
END_TEST

START_TEST(test_status_without_jobs) {
  hoop__status status;
  query_status(&status);
  ck_assert_msg(status.njobs == 0, "a fresh server: expected no jobs, got %u", status.njobs);
  hoop__status_free(&status);
}
END_TEST

/* ---- jobs side by side ----------------------------------------------------------------------- */

/* Two jobs with the same hosts and rank numbers: each member gets its own job's table, and one
 * completes while the other waits. */
START_TEST(test_two_jobs_at_once) {
  client alpha[] = {
      {"h1", "alpha-0", 0, 0, 0, 1, -1},
      {"h2", "alpha-1", 1, 1, 0, 1, -1},
  };
  client beta[] = {
      {"h1", "beta-0", 0, 0, 0, 2, -1},
      {"h1", "beta-1", 1, 1, 1, 2, -1},
      {"h2", "beta-2", 2, 2, 0, 1, -1},
  };
  join_in_order("alpha", 2, 0, alpha, 1);
  join_in_order("beta", 3, 0, beta, 2);
  join_in_order("alpha", 2, 1, alpha + 1, 1);
  uint8_t alpha_nonce[HOOP__WIRE_NONCE], beta_nonce[HOOP__WIRE_NONCE];
  expect_tables(alpha, 2, alpha_nonce);
  wait_joined("beta", 2);
  join_in_order("beta", 3, 2, beta + 2, 1);
  expect_tables(beta, 3, beta_nonce);
  ck_assert_msg(memcmp(alpha_nonce, beta_nonce, HOOP__WIRE_NONCE) != 0,
                "expected a nonce per job, got the same for 'alpha' and 'beta'");
}
END_TEST

/* ---- limits ---------------------------------------------------------------------------------- */

/* A STATUS_REQ on a new connection: 0 if it is served, -1 if refused with an ERROR. */
static int status_served(void) {
  int fd = try_connect();
  ck_assert_msg(fd >= 0, "status query: expected to connect, got %s", strerror(errno));
  uint8_t *payload;
  uint32_t len;
  /* A server at its limit refuses at once, with an ERROR in place of the CHALLENGE. */
  uint16_t type = read_message(fd, &payload, &len, "status query", "a CHALLENGE or an ERROR");
  free(payload);
  if (type == HOOP_MSG_CHALLENGE) {
    send_status_req(fd);
    type = read_message(fd, &payload, &len, "status query", "a STATUS or an ERROR");
    free(payload);
  }
  close(fd);
  ck_assert_msg(type == HOOP_MSG_STATUS || type == HOOP_MSG_ERROR,
                "status query: expected a STATUS or an ERROR, got type %u", type);
  return type == HOOP_MSG_STATUS ? 0 : -1;
}

/* Past max_connections, a newcomer is served by closing the oldest silent connection (one that
 * has sent no request) of the address that holds the most; when none is silent, it is told the
 * server is full; once one leaves, a new one is served again. */
START_TEST(test_connection_limit) {
  hoop__rdzv_options options = {.listen = "127.0.0.1:0", .max_connections = 8};
  start_server(&options);
  int ranks[8];
  for (int r = 0; r < 7; r++) { /* a job of 9 that waits: none of its connections is silent */
    char addr[32];
    snprintf(addr, sizeof addr, "10.0.0.%d:1", r + 1);
    ranks[r] = join("waiting", 9, r, "h", addr);
    sleep_ms(20); /* its HELLO read before the next connection comes */
  }
  int silent = connect_server(); /* the eighth: full */
  ranks[7] = connect_server();   /* served, in the silent one's place */
  expect_closed(silent, "the silent connection of a full server, when another came");
  close(silent);
  hoop__hello hello = hello_for("waiting", 9, 7, "h", "10.0.0.8:1");
  send_hello_on(ranks[7], &hello, NULL);
  sleep_ms(20);
  int ninth = try_connect(); /* none silent: refused at once, an ERROR in place of the CHALLENGE */
  ck_assert_msg(ninth >= 0, "a ninth connection: expected to connect, got %s", strerror(errno));
  hoop__error_msg error;
  expect_error(ninth, HOOP_ERR_SYSTEM, &error, "a ninth connection");
  expect_message_has(&error, "8 connections open", "a ninth connection");
  expect_closed(ninth, "a ninth connection");
  close(ninth);
  for (int r = 1; r < 8; r++)
    close(ranks[r]);
  close(ranks[0]);
  uint64_t start = now_ms();
  while (status_served() != 0) {
    ck_assert_msg(now_ms() - start < DEADLINE_MS,
                  "after a connection closed: expected a new one served, refused for %d ms",
                  DEADLINE_MS);
    sleep_ms(1);
  }
}
END_TEST

/* One address holds at most max_idle_per_address connections that have sent nothing for a second:
 * the next connection from it closes the oldest of those past the limit, so silence from one place
 * cannot fill max_connections slowly. Fresh connections are counted only against the address's
 * share of the server (a quarter, 8 here): a burst of real ranks within it stays whole. */
static void join_running(const char *job, uint32_t n, int *fds);
static void expect_quiet(int fd, unsigned ms, const char *who);
START_TEST(test_idle_limit_per_address) {
  hoop__rdzv_options options = {
      .listen = "127.0.0.1:0", .max_connections = 32, .max_idle_per_address = 3};
  start_server(&options);
  int idle[7];
  for (int i = 0; i < 6; i++)
    idle[i] = connect_server();
  for (int i = 0; i < 6; i++) /* a burst: none counted yet */
    expect_quiet(idle[i], 10, "a fresh silent connection");
  sleep_ms(1100);
  idle[6] = connect_server(); /* six silent for a second: the oldest four go */
  for (int i = 0; i < 4; i++)
    expect_closed(idle[i], "a silent connection past the limit per address");
  for (int i = 4; i < 7; i++)
    expect_quiet(idle[i], 50, "one of the newest silent connections");
  int fds[2];
  join_running("after-the-silence", 2, fds);
  for (int i = 0; i < 7; i++)
    close(idle[i]);
  say_bye(fds[0], "rank 0");
  say_bye(fds[1], "rank 1");
}
END_TEST

/* A member whose SHRINK says it waits 0 ms cannot end the shrink at once, leaving out every member
 * that had not asked yet: the server waits the job's own timeout for them, so the two that ask
 * 300 ms later are in the next generation, all three in one table. */
static void send_shrink(int fd, uint32_t rank, uint32_t timeout_ms) {
  hoop__shrink_msg msg = {.generation = 0, .rank = rank, .timeout_ms = timeout_ms};
  snprintf(msg.addr, sizeof msg.addr, "m-%u'", rank);
  hoop__wbuf wb = {0};
  ck_assert_int_eq(hoop__wire_encode_shrink(&wb, &msg), 0);
  send_bytes(fd, wb.data, wb.len, "a SHRINK");
  hoop__wbuf_free(&wb);
}

START_TEST(test_shrink_timeout_zero_waits_for_the_others) {
  hoop__rdzv_options options = {.listen = "127.0.0.1:0"};
  start_server(&options);
  int fds[3];
  join_running("shrink-zero", 3, fds);
  send_shrink(fds[0], 0, 0);
  sleep_ms(300);
  send_shrink(fds[1], 1, JOB_TIMEOUT_MS);
  send_shrink(fds[2], 2, JOB_TIMEOUT_MS);
  for (int i = 0; i < 3; i++) {
    uint8_t *payload;
    uint32_t len;
    hoop__table table;
    uint16_t type = read_message(fds[i], &payload, &len, "a member", "the next generation's TABLE");
    ck_assert_msg(type == HOOP_MSG_TABLE && hoop__wire_decode_table(payload, len, &table) == 0,
                  "member %d: expected the next generation's TABLE, got type %u", i, type);
    ck_assert_msg(table.size == 3, "member %d: a table of %u ranks, not 3: a member was left out",
                  i, table.size);
    hoop__table_free(&table);
    free(payload);
  }
  for (int i = 0; i < 3; i++)
    close(fds[i]);
}
END_TEST

/* Past max_jobs a new job is refused; the waiting one completes, and then a new one is taken. */
START_TEST(test_job_limit) {
  hoop__rdzv_options options = {.listen = "127.0.0.1:0", .max_jobs = 1};
  start_server(&options);
  client clients[] = {
      {"a", "a-0", -1, 0, 0, 1, -1},
      {"b", "b-0", -1, 1, 0, 1, -1},
  };
  join_in_order("first", 2, 0, clients, 1);
  int other = join("second", 2, -1, "c", "c-0");
  hoop__error_msg error;
  expect_error(other, HOOP_ERR_SYSTEM, &error, "c-0 (a second job)");
  expect_message_has(&error, "1 jobs waiting", "c-0");
  expect_message_has(&error, "job 'second' refused", "c-0");
  close(other);
  join_in_order("first", 2, 1, clients + 1, 1);
  expect_tables(clients, 2, NULL);
  client alone[] = {{"c", "c-1", -1, 0, 0, 1, -1}};
  join_in_order("second", 1, 0, alone, 1);
  expect_tables(alone, 1, NULL);
}
END_TEST

/* A connection that sends nothing, or half a header, is closed after idle_timeout_s. */
START_TEST(test_idle_connection_closed) {
  hoop__rdzv_options options = {.listen = "127.0.0.1:0", .idle_timeout_s = 0.2};
  start_server(&options);
  uint64_t start = now_ms();
  int silent = connect_server();
  int halting = connect_server();
  uint8_t header[HOOP__WIRE_HEADER_SIZE];
  header_bytes(header, HOOP__WIRE_MAGIC, HOOP__WIRE_VERSION, HOOP_MSG_STATUS_REQ, 0);
  send_bytes(halting, header, 5, "half a header");
  expect_closed(silent, "a silent connection");
  expect_closed(halting, "half a header");
  uint64_t waited = now_ms() - start;
  ck_assert_msg(waited >= 150, "idle close: expected after about 200 ms, came after %llu ms",
                (unsigned long long)waited);
  close(silent);
  close(halting);
}
END_TEST

/* A member waits for its job however long past idle_timeout_s that takes. */
START_TEST(test_member_outlives_idle_timeout) {
  hoop__rdzv_options options = {.listen = "127.0.0.1:0", .idle_timeout_s = 0.2};
  start_server(&options);
  client clients[] = {
      {"a", "a-0", -1, 0, 0, 1, -1},
      {"b", "b-0", -1, 1, 0, 1, -1},
  };
  join_in_order("patient", 2, 0, clients, 1);
  sleep_ms(500);
  join_in_order("patient", 2, 1, clients + 1, 1);
  expect_tables(clients, 2, NULL);
}
END_TEST

static atomic_int done_calls;

static void count_done(void *arg) {
  (void)arg;
  atomic_fetch_add(&done_calls, 1);
}

/* With `once`, on_done comes exactly once, and the server takes no connection after. */
static void expect_done_once(void) {
  uint64_t start = now_ms();
  while (atomic_load(&done_calls) == 0) {
    ck_assert_msg(now_ms() - start < DEADLINE_MS, "on_done: expected a call, none in %d ms",
                  DEADLINE_MS);
    sleep_ms(1);
  }
  int late = try_connect();
  ck_assert_msg(late < 0 && errno == ECONNREFUSED,
                "a connection after the one job: expected it refused, got %s",
                late >= 0 ? "it accepted" : strerror(errno));
  sleep_ms(50);
  int calls = atomic_load(&done_calls);
  ck_assert_msg(calls == 1, "on_done: expected 1 call, got %d", calls);
}

START_TEST(test_once_after_table) {
  hoop__rdzv_options options = {.listen = "127.0.0.1:0", .once = 1, .on_done = count_done};
  atomic_store(&done_calls, 0);
  start_server(&options);
  int bystander = connect_server();
  client clients[] = {
      {"a", "a-0", -1, 0, 0, 1, -1},
      {"b", "b-0", -1, 1, 0, 1, -1},
  };
  join_in_order("only", 2, 0, clients, 2);
  expect_tables(clients, 2, NULL);
  expect_closed(bystander, "a connection idle while the one job completed");
  close(bystander);
  expect_done_once();
}
END_TEST

START_TEST(test_once_after_timeout) {
  hoop__rdzv_options options = {.listen = "127.0.0.1:0", .once = 1, .on_done = count_done};
  atomic_store(&done_calls, 0);
  start_server(&options);
  hoop__hello hello = hello_for("lonely", 2, -1, "a", "a-0");
  hello.timeout_ms = 200;
  int fd = send_hello(&hello);
  hoop__error_msg error;
  expect_error(fd, HOOP_ERR_TIMEOUT, &error, "a-0");
  close(fd);
  expect_done_once();
}
END_TEST

/* ---- addresses and stopping ------------------------------------------------------------------ */

START_TEST(test_ipv6_listen) {
  hoop__rdzv_options options = {.listen = "[::1]:0"};
  start_server(&options);
  client clients[] = {
      {"a", "[::1]:1000", -1, 0, 0, 2, -1},
      {"a", "[::1]:1001", -1, 1, 1, 2, -1},
  };
  join_in_order("six", 2, 0, clients, 2);
  expect_tables(clients, 2, NULL);
}
END_TEST

START_TEST(test_bad_listen_address_refused) {
  const char *listens[] = {"nonsense", "192.0.2.1:0"};
  const char *says[] = {"is not host:port", "cannot listen on"};
  for (int i = 0; i < 2; i++) {
    hoop__rdzv_options options = {.listen = listens[i]};
    hoop__rdzv_thread *thread = NULL;
    char err[256] = "";
    int rc = hoop__rdzv_thread_start(&options, &thread, err, sizeof err);
    ck_assert_msg(rc == -1 && thread == NULL, "listen '%s': expected -1 and no thread, got %d",
                  listens[i], rc);
    ck_assert_msg(strstr(err, says[i]) != NULL,
                  "listen '%s': expected a message with '%s', got '%s'", listens[i], says[i], err);
  }
}
END_TEST

/* Stopping the thread drops a waiting member, an idle client and a half-read request. */
START_TEST(test_stop_with_clients_connected) {
  int member = join("cut", 2, -1, "a", "a-0");
  wait_joined("cut", 1);
  int silent = connect_server();
  int halting = connect_server();
  send_bytes(halting, "HOO", 3, "half a header");
  stop_server();
  expect_closed(member, "a member waiting at the stop");
  expect_closed(silent, "a silent connection at the stop");
  expect_closed(halting, "half a header at the stop");
  close(member);
  close(silent);
  close(halting);
  int late = try_connect();
  ck_assert_msg(late < 0, "a connection after the stop: expected it refused, got it accepted");
}
END_TEST

/* ---- runner ---------------------------------------------------------------------------------- */

/* ---- authentication -------------------------------------------------------------------------- */

#define TOKEN "correct horse battery staple"

static void start_token_server(void) {
  hoop__rdzv_options options = {.listen = "127.0.0.1:0", .token = TOKEN};
  start_server(&options);
}

/* Wait until a status query, proven with TOKEN, counts `joined` ranks in job. */
static void wait_joined_proven(const char *job, uint32_t joined) {
  uint64_t start = now_ms();
  for (;;) {
    hoop__status status;
    query_status_as(&status, TOKEN);
    const hoop__job_status *found = status_job(&status, job);
    uint32_t now = found ? found->joined : 0;
    hoop__status_free(&status);
    if (now == joined)
      return;
    ck_assert_msg(now_ms() - start < DEADLINE_MS, "job '%s': expected %u ranks joined, got %u", job,
                  joined, now);
    sleep_ms(1);
  }
}

/* The hello of a client that sends it on a connection of its own, proven with token. */
static int join_proven(const char *job, const char *host, const char *addr, const char *token) {
  hoop__hello hello = hello_for(job, 2, -1, host, addr);
  int fd = connect_server();
  send_hello_on(fd, &hello, token);
  return fd;
}

static void expect_auth_refused(int fd, const char *reason, const char *who) {
  hoop__error_msg error;
  expect_error(fd, HOOP_ERR_AUTH, &error, who);
  expect_message_has(&error, "authentication failed", who);
  expect_message_has(&error, reason, who);
  expect_closed(fd, who);
  close(fd);
}

/* Every connection opens with a fresh challenge; it asks for a proof exactly when the server has
 * a token. */
START_TEST(test_challenge_says_whether_a_token_is_needed) {
  start_default_server();
  close(connect_server());
  ck_assert_msg(last_challenge.flags == 0, "a server without a token: expected flags 0, got %u",
                last_challenge.flags);
  stop_server();
  start_token_server();
  hoop__challenge first;
  close(connect_server());
  first = last_challenge;
  close(connect_server());
  ck_assert_msg(first.flags == HOOP__CHALLENGE_AUTH && last_challenge.flags == HOOP__CHALLENGE_AUTH,
                "a server with a token: expected the AUTH flag, got %u and %u", first.flags,
                last_challenge.flags);
  ck_assert_msg(memcmp(first.nonce, last_challenge.nonce, HOOP__WIRE_CHALLENGE) != 0,
                "two connections: expected two different challenges, got the same");
}
END_TEST

/* Ranks that prove the token get their tables; the table differs in nothing from an open job. */
START_TEST(test_proven_ranks_join) {
  start_token_server();
  int a = join_proven("guarded", "a", "a-0", TOKEN);
  wait_joined_proven("guarded", 1);
  int b = join_proven("guarded", "b", "b-0", TOKEN);
  hoop__table table;
  expect_table(a, &table, "a-0");
  ck_assert_msg(table.rank == 0 && table.size == 2, "a-0: expected rank 0 of 2, got %u of %u",
                table.rank, table.size);
  hoop__table_free(&table);
  expect_table(b, &table, "b-0");
  ck_assert_msg(table.rank == 1, "b-0: expected rank 1, got %u", table.rank);
  hoop__table_free(&table);
  close(a);
  close(b);
}
END_TEST

/* A wrong token, no proof, a proof replayed from another connection and a proof over other HELLO
 * fields are each refused with HOOP_ERR_AUTH; none of them joins or disturbs the job, which a
 * rank with the token then completes. */
START_TEST(test_bad_proofs_refused_and_job_unharmed) {
  start_token_server();
  int member = join_proven("guarded", "a", "a-0", TOKEN);
  wait_joined_proven("guarded", 1);

  expect_auth_refused(join_proven("guarded", "x", "x-wrong", "correct horse battery stapler"),
                      "does not match", "a wrong token");
  expect_auth_refused(join_proven("guarded", "x", "x-none", NULL), "no proof", "no proof");

  hoop__hello hello = hello_for("guarded", 2, -1, "x", "x-replay");
  int old = connect_server();
  hoop__challenge seen = last_challenge;
  int replay = connect_server();
  last_challenge = seen; /* prove over the other connection's challenge */
  send_hello_on(replay, &hello, TOKEN);
  expect_auth_refused(replay, "does not match", "a proof from another connection");
  close(old);

  /* A proof made for one address, sent with another: a changed field must not pass. */
  int tampered = connect_server();
  hoop__hello signed_for = hello_for("guarded", 2, -1, "x", "10.0.0.1:1");
  hoop__hello sent = hello_for("guarded", 2, -1, "x", "10.6.6.6:1");
  sent.proof_len = HOOP__AUTH_PROOF;
  ck_assert_int_eq(hoop__auth_hello_proof(TOKEN, last_challenge.nonce, &signed_for, sent.proof), 0);
  hoop__wbuf wb = {0};
  ck_assert_int_eq(hoop__wire_encode_hello(&wb, &sent), 0);
  send_bytes(tampered, wb.data, wb.len, "a changed HELLO");
  hoop__wbuf_free(&wb);
  expect_auth_refused(tampered, "does not match", "a HELLO changed after it was proven");

  wait_joined_proven("guarded", 1);
  expect_no_reply(member, "a-0");
  int second = join_proven("guarded", "b", "b-0", TOKEN);
  hoop__table table;
  expect_table(member, &table, "a-0");
  hoop__table_free(&table);
  expect_table(second, &table, "b-0");
  hoop__table_free(&table);
  close(member);
  close(second);
}
END_TEST

/* The status lists job names and hosts: with a token it is for holders of the token only. */
START_TEST(test_status_needs_the_token) {
  start_token_server();
  int fd = connect_server();
  send_status_req(fd);
  expect_auth_refused(fd, "no proof", "a status query without a proof");
  fd = connect_server();
  send_status_req_as(fd, "guess");
  expect_auth_refused(fd, "does not match", "a status query with a wrong token");
  hoop__status status;
  query_status_as(&status, TOKEN);
  ck_assert_uint_eq(status.njobs, 0);
  hoop__status_free(&status);
}
END_TEST

/* ---- kept connections: ABORT, BYE and lost members ------------------------------------------ */

/* n members of job, rank i asking for rank i (host "m", addr "m-i"), each having read its TABLE
 * with token's proofs (NULL: none); fds[i] is rank i's kept connection. */
/* n members join job and get their tables; with a token, each table is followed by the server's
 * TABLE_PROOF, over that member's HELLO nonce and its table as received, which must check. */
static void join_running_as(const char *job, uint32_t n, int *fds, const char *token) {
  for (uint32_t i = 0; i < n; i++) {
    char addr[32];
    snprintf(addr, sizeof addr, "m-%u", i);
    hoop__hello hello = hello_for(job, n, (int32_t)i, "m", addr);
    memset(hello.nonce, (int)(0x40 + i), sizeof hello.nonce);
    fds[i] = connect_server();
    send_hello_on(fds[i], &hello, token);
  }
  for (uint32_t i = 0; i < n; i++) {
    uint8_t *payload, *proof_payload;
    uint32_t len, proof_len;
    hoop__table table;
    uint16_t type = read_message(fds[i], &payload, &len, "a member", "a TABLE");
    ck_assert_msg(type == HOOP_MSG_TABLE && hoop__wire_decode_table(payload, len, &table) == 0,
                  "member %u: expected a TABLE, got a message of type %u", i, type);
    ck_assert_msg(table.rank == i, "member %u: expected rank %u in its table, got %u", i, i,
                  table.rank);
    hoop__table_free(&table);
    if (token) {
      type = read_message(fds[i], &proof_payload, &proof_len, "a member", "a TABLE_PROOF");
      hoop__table_proof got;
      ck_assert_msg(type == HOOP_MSG_TABLE_PROOF &&
                        hoop__wire_decode_table_proof(proof_payload, proof_len, &got) == 0,
                    "member %u: expected a TABLE_PROOF after its table, got type %u", i, type);
      uint8_t nonce[HOOP__WIRE_CHALLENGE], digest[HOOP__AUTH_PROOF], want[HOOP__AUTH_PROOF];
      memset(nonce, (int)(0x40 + i), sizeof nonce);
      hoop__auth_digest(payload + HOOP__WIRE_TABLE_OWN, len - HOOP__WIRE_TABLE_OWN, digest);
      hoop__auth_table_proof(token, nonce, payload, digest, want);
      ck_assert_msg(got.proof_len == sizeof want && memcmp(got.proof, want, sizeof want) == 0,
                    "member %u: the server's TABLE_PROOF does not check", i);
      nonce[0] ^= 1; /* another member's nonce, or a replay: another proof */
      hoop__auth_table_proof(token, nonce, payload, digest, want);
      ck_assert(memcmp(got.proof, want, sizeof want) != 0);
      free(proof_payload);
    }
    free(payload);
  }
}

static void join_running(const char *job, uint32_t n, int *fds) {
  join_running_as(job, n, fds, NULL);
}

static void send_abort(int fd, uint32_t rank, const char *reason, const char *who) {
  hoop__abort_msg msg = {.rank = rank};
  snprintf(msg.reason, sizeof msg.reason, "%s", reason);
  hoop__wbuf out = {0};
  ck_assert_int_eq(hoop__wire_encode_abort(&out, &msg), 0);
  send_bytes(fd, out.data, out.len, who);
  hoop__wbuf_free(&out);
}

static void expect_notice(int fd, hoop_result code, uint32_t origin, const char *text,
                          const char *who) {
  uint8_t *payload;
  uint32_t len;
  hoop__notice notice;
  uint16_t type = read_message(fd, &payload, &len, who, "a NOTICE");
  int rc = type == HOOP_MSG_NOTICE ? hoop__wire_decode_notice(payload, len, &notice) : -1;
  free(payload);
  ck_assert_msg(rc == 0, "%s: expected a NOTICE, got a message of type %u (decoded: %d)", who, type,
                rc);
  ck_assert_msg(notice.code == (uint32_t)code && notice.origin == origin &&
                    strcmp(notice.message, text) == 0,
                "%s: expected a NOTICE (%s) from rank %u saying '%s', got (%s) from rank %u "
                "saying '%s'",
                who, hoop_strerror(code), origin, text, hoop_strerror((hoop_result)notice.code),
                notice.origin, notice.message);
}

/* Nothing comes on fd for ms (a relay would have come by then), nor does it close. */
static void expect_quiet(int fd, unsigned ms, const char *who) {
  sleep_ms(ms);
  expect_no_reply(fd, who);
}

/* A job's status lists it as waiting: 1 if job is listed so. */
static int job_listed(const char *job) {
  hoop__status status;
  query_status(&status);
  const hoop__job_status *entry = status_job(&status, job);
  int listed = entry && !entry->health.running;
  hoop__status_free(&status);
  return listed;
}

/* A member's ABORT reaches every other member as a NOTICE in the same words as the data path's
 * ("aborted by rank R: reason"), and not the member itself; its closing afterwards is no loss. */
START_TEST(test_member_abort_relayed) {
  int fds[3];
  join_running("abort", 3, fds);
  send_abort(fds[1], 1, "loss is NaN", "rank 1");
  expect_notice(fds[0], HOOP_ERR_ABORTED, 1, "aborted by rank 1: loss is NaN", "rank 0");
  expect_notice(fds[2], HOOP_ERR_ABORTED, 1, "aborted by rank 1: loss is NaN", "rank 2");
  expect_no_reply(fds[1], "rank 1 (the aborting member)");
  close(fds[1]);
  expect_quiet(fds[0], 100, "rank 0 after rank 1 closed");
  expect_no_reply(fds[2], "rank 2 after rank 1 closed");
  say_bye(fds[0], "rank 0");
  say_bye(fds[2], "rank 2");
}
END_TEST

/* A member may abort in its own name only: an ABORT for another rank closes the sender's
 * connection, and the others hear that the sender was lost, never that the named rank aborted. */
START_TEST(test_abort_in_another_name_refused) {
  int fds[3];
  join_running("forged", 3, fds);
  send_abort(fds[2], 0, "forged by rank 2", "rank 2");
  expect_closed(fds[2], "rank 2 (aborting in rank 0's name)");
  close(fds[2]);
  expect_notice(fds[0], HOOP_ERR_PEER_LOST, 2, "rank 2 lost (rendezvous connection closed)",
                "rank 0");
  expect_notice(fds[1], HOOP_ERR_PEER_LOST, 2, "rank 2 lost (rendezvous connection closed)",
                "rank 1");
  say_bye(fds[0], "rank 0");
  say_bye(fds[1], "rank 1");
}
END_TEST

/* A member that says BYE leaves quietly, in any order; one that closes without it was lost, and
 * the members still there are told. Once all have left the job is gone. */
START_TEST(test_bye_quiet_close_lost) {
  int fds[4];
  join_running("leave", 4, fds);
  say_bye(fds[3], "rank 3");
  say_bye(fds[0], "rank 0");
  expect_quiet(fds[1], 100, "rank 1 after ranks 3 and 0 said BYE");
  expect_no_reply(fds[2], "rank 2 after ranks 3 and 0 said BYE");
  close(fds[1]); /* no BYE: a crash */
  expect_notice(fds[2], HOOP_ERR_PEER_LOST, 1, "rank 1 lost (rendezvous connection closed)",
                "rank 2");
  say_bye(fds[2], "rank 2");
}
END_TEST

/* Garbage, an unknown type or a second BYE on a member's connection close it (a loss to the
 * others); the server serves on. */
START_TEST(test_member_garbage_closes_only_it) {
  int fds[3];
  join_running("garbage", 3, fds);
  const char junk[] = "GET / HTTP/1.1\r\n\r\n";
  send_bytes(fds[0], junk, sizeof junk - 1, "rank 0");
  expect_closed(fds[0], "rank 0 (sent junk)");
  close(fds[0]);
  expect_notice(fds[1], HOOP_ERR_PEER_LOST, 0, "rank 0 lost (rendezvous connection closed)",
                "rank 1");
  expect_notice(fds[2], HOOP_ERR_PEER_LOST, 0, "rank 0 lost (rendezvous connection closed)",
                "rank 2");
  hoop__wbuf out = {0};
  ck_assert_int_eq(hoop__wire_encode_bye(&out), 0);
  ck_assert_int_eq(hoop__wire_encode_bye(&out), 0); /* a second one is refused */
  send_bytes(fds[1], out.data, out.len, "rank 1");
  hoop__wbuf_free(&out);
  expect_closed(fds[1], "rank 1 (sent two BYEs)");
  close(fds[1]);
  expect_quiet(fds[2], 100, "rank 2 after rank 1 said BYE and more");
  say_bye(fds[2], "rank 2");
  hoop__status status;
  query_status(&status); /* still serving */
  hoop__status_free(&status);
}
END_TEST

/* ABORT and BYE belong to members: as the first request of a connection they are refused like
 * any message a client does not send first, and the job's members hear nothing. */
START_TEST(test_abort_before_join_refused) {
  int fds[2];
  join_running("victim", 2, fds);
  int stranger = connect_server();
  send_abort(stranger, 0, "forged by a stranger", "a stranger");
  expect_closed(stranger, "a stranger sending ABORT first");
  close(stranger);
  expect_quiet(fds[0], 100, "rank 0 after a stranger's ABORT");
  expect_no_reply(fds[1], "rank 1 after a stranger's ABORT");
  say_bye(fds[0], "rank 0");
  say_bye(fds[1], "rank 1");
}
END_TEST

/* With a token, a connection that failed its proof is no member: its ABORT is never relayed. */
START_TEST(test_abort_after_failed_proof_refused) {
  start_token_server();
  int fds[2];
  join_running_as("secured", 2, fds, TOKEN);
  hoop__hello hello = hello_for("secured", 2, 0, "m", "intruder");
  int intruder = connect_server();
  send_hello_on(intruder, &hello, "wrong token");
  hoop__error_msg error;
  expect_error(intruder, HOOP_ERR_AUTH, &error, "the intruder");
  /* The server is closing this connection: the send may fail, and either way nothing is told. */
  hoop__abort_msg forged = {.rank = 0, .reason = "forged"};
  hoop__wbuf out = {0};
  ck_assert_int_eq(hoop__wire_encode_abort(&out, &forged), 0);
  if (send(intruder, out.data, out.len, MSG_NOSIGNAL) < 0)
    ck_assert_msg(errno == EPIPE || errno == ECONNRESET,
                  "the intruder's ABORT: expected it sent or refused by a closed connection, "
                  "got %s",
                  strerror(errno));
  hoop__wbuf_free(&out);
  close(intruder);
  int stranger = connect_server();
  send_abort(stranger, 0, "forged by a stranger", "a stranger");
  expect_closed(stranger, "a stranger sending ABORT first");
  close(stranger);
  expect_quiet(fds[0], 100, "rank 0 after forged ABORTs");
  expect_no_reply(fds[1], "rank 1 after forged ABORTs");
  send_abort(fds[1], 1, "a real one", "rank 1");
  expect_notice(fds[0], HOOP_ERR_ABORTED, 1, "aborted by rank 1: a real one", "rank 0");
  close(fds[1]);
  say_bye(fds[0], "rank 0");
}
END_TEST

/* A running job is no longer listed as waiting, and its id may start a new job at once. */
START_TEST(test_running_job_frees_its_id) {
  int fds[2], again[2];
  join_running("reused", 2, fds);
  ck_assert_msg(!job_listed("reused"), "status: expected the running job 'reused' not listed as "
                                       "waiting, got it listed");
  join_running("reused", 2, again);
  send_abort(again[0], 0, "second incarnation", "new rank 0");
  expect_notice(again[1], HOOP_ERR_ABORTED, 0, "aborted by rank 0: second incarnation",
                "new rank 1");
  expect_quiet(fds[1], 100, "old rank 1 (another job of the same id aborted)");
  expect_no_reply(fds[0], "old rank 0 (another job of the same id aborted)");
  for (int i = 0; i < 2; i++) {
    say_bye(fds[i], "old rank");
    say_bye(again[i], "new rank");
  }
}
END_TEST

/* With `once`, the job is over only when its members have left: on_done waits for them. */
START_TEST(test_once_waits_for_members) {
  hoop__rdzv_options options = {.listen = "127.0.0.1:0", .once = 1, .on_done = count_done};
  atomic_store(&done_calls, 0);
  start_server(&options);
  int fds[2];
  join_running("members", 2, fds);
  sleep_ms(100);
  int calls = atomic_load(&done_calls);
  ck_assert_msg(calls == 0, "on_done with members connected: expected no call, got %d", calls);
  send_abort(fds[0], 0, "still relayed", "rank 0");
  expect_notice(fds[1], HOOP_ERR_ABORTED, 0, "aborted by rank 0: still relayed", "rank 1");
  close(fds[0]);
  say_bye(fds[1], "rank 1");
  expect_done_once();
}
END_TEST

/* Each case gets a fresh server when `fixture` says so; the others start their own. */
/* ---- health: members' STATS, the server's VIEW, a running job's status ---- */

/* A member's STATS of calls first..first+n-1: in call first+i it waited waited[i] and came at
 * came[i] by clock `clock` (0: its own); 1 MiB came from rank link_from in link_us (none: -1). */
static void send_samples(int fd, uint32_t first, uint32_t n, const uint32_t *waited, uint64_t clock,
                         const uint32_t *came, int link_from, uint64_t link_us, const char *who) {
  hoop__stats_msg msg = {.calls = first + n, .bytes = 4096, .since_us = 10000000, .clock = clock};
  if (link_from >= 0) {
    msg.nlinks = 1;
    msg.links[0] = (hoop__link){.from = (uint32_t)link_from, .bytes = 1 << 20, .us = link_us};
  }
  for (uint32_t i = 0; i < n; i++) {
    msg.samples[i] = (hoop__stats_sample){first + i, waited[i], came ? came[i] : 0};
    msg.waited_us += waited[i];
  }
  msg.in_calls_us = msg.waited_us + 1000;
  msg.nsamples = n;
  hoop__wbuf out = {0};
  ck_assert_int_eq(hoop__wire_encode_stats(&out, &msg), 0);
  send_bytes(fd, out.data, out.len, who);
  hoop__wbuf_free(&out);
}

/* rank's STATS on a clock of its own: calls first..first+n-1, in which it waited base_us, less
 * late_us (the rank that comes later waits less); links as send_samples. */
static void send_stats(int fd, uint32_t first, uint32_t n, uint32_t base_us, uint32_t late_us,
                       int link_from, uint64_t link_us, const char *who) {
  uint32_t waited[HOOP__WIRE_STATS_SAMPLES];
  for (uint32_t i = 0; i < n; i++)
    waited[i] = base_us - late_us + (i % 3) * 10; /* every rank alike, call by call */
  send_samples(fd, first, n, waited, 0, NULL, link_from, link_us, who);
}

/* A VIEW of a job of size ranks (expect_view: of 3). */
static void expect_view_of(int fd, uint32_t size, hoop__view_msg *view, const char *who) {
  uint8_t *payload;
  uint32_t len;
  uint16_t type = read_message(fd, &payload, &len, who, "a VIEW");
  int rc = type == HOOP_MSG_VIEW ? hoop__wire_decode_view(payload, len, size, view) : -1;
  free(payload);
  ck_assert_msg(rc == 0, "%s: expected a VIEW, got a message of type %u (decoded: %d)", who, type,
                rc);
}

static void expect_view(int fd, hoop__view_msg *view, const char *who) {
  expect_view_of(fd, 3, view, who);
}

/* Three members describe calls 1..40; rank 1 comes 7 ms after the others, rank 2 1 ms after: each
 * VIEW names rank 1 first, late by 7 ms, then rank 2 by 1 ms, over the 40 calls every rank
 * described, and the slowest links the members measured (2 -> 0 before 0 -> 1, 2 -> 1 not at
 * all); the status lists the job as running with the same, its call rate and time waiting.
 * A member's next STATS within 250 ms gets no answer; one whose calls are out of order is closed,
 * a loss to the others. */
START_TEST(test_stats_view_and_health) {
  int fds[3];
  uint32_t late[3] = {0, 7000, 1000};
  int link_from[3] = {2, 0, -1};
  uint64_t link_us[3] = {40000, 10000, 0};
  join_running("healthy", 3, fds);
  hoop__view_msg view;
  for (int i = 0; i < 3; i++) {
    char who[32];
    snprintf(who, sizeof who, "rank %d", i);
    send_stats(fds[i], 1, 40, 9000, late[i], link_from[i], link_us[i], who);
    expect_view(fds[i], &view, who);
  }
  /* The last member's answer was made from every member's STATS (the first ones' from fewer). */
  ck_assert_msg(view.reporting == 3 && view.calls == 40 && view.nlate == 3,
                "expected a view of 3 ranks over 40 calls, got %u ranks over %u calls, %u named",
                view.reporting, view.calls, view.nlate);
  ck_assert_msg(view.late[0].rank == 1 && view.late[0].median_us == 7000 &&
                    view.late[1].rank == 2 && view.late[1].median_us == 1000 &&
                    view.late[2].rank == 0 && view.late[2].max_us == 0,
                "expected rank 1 late 7000 us, rank 2 1000 us, rank 0 0; got %u %u, %u %u, %u %u",
                view.late[0].rank, view.late[0].median_us, view.late[1].rank,
                view.late[1].median_us, view.late[2].rank, view.late[2].median_us);
  ck_assert_msg(view.nlinks == 2 && view.links[0].from == 2 && view.links[0].to == 0 &&
                    view.links[0].us == 40000 && view.links[1].from == 0 && view.links[1].to == 1,
                "expected the links 2 -> 0 then 0 -> 1, got %u links, the first %u -> %u",
                view.nlinks, view.links[0].from, view.links[0].to);
  hoop__status status;
  query_status(&status);
  const hoop__job_status *job = status_job(&status, "healthy");
  ck_assert_msg(job && job->health.running && job->health.reporting == 3 &&
                    job->health.calls == 40 && job->health.nlate == 3 &&
                    job->health.late[0].rank == 1 && job->health.late[0].median_us == 7000,
                "status: expected 'healthy' running, rank 1 first at 7000 us");
  ck_assert_msg(job->health.nlinks == 2 && job->health.links[0].from == 2,
                "status: expected the slowest link from rank 2");
  /* Each member: 41 calls in 10 s, waiting 40 calls' worth of its waits (360, 80 and 320 ms of
   * the 10 s: 25 permille on average). */
  ck_assert_msg(job->health.calls_per_s == 4, "status: %u calls per second, expected 4",
                job->health.calls_per_s);
  ck_assert_msg(job->health.wait_permille == 25, "status: waiting %u permille, expected 25",
                job->health.wait_permille);
  hoop__status_free(&status);
  send_stats(fds[0], 41, 10, 9000, 0, -1, 0, "rank 0 again at once");
  expect_quiet(fds[0], 100, "rank 0 answered at most every 250 ms");
  /* Calls out of order: a malformed STATS. */
  hoop__stats_msg bad = {.nsamples = 2, .samples = {{5, 1}, {4, 1}}};
  uint8_t raw[HOOP__WIRE_HEADER_SIZE + 52 + 24 + 4]; /* six u64, the count, two samples, 0 links */
  hoop__wbuf out = {0};
  bad.samples[1].seq = 6; /* encodable, then broken in place */
  ck_assert_int_eq(hoop__wire_encode_stats(&out, &bad), 0);
  ck_assert(out.len == sizeof raw);
  memcpy(raw, out.data, out.len);
  hoop__wbuf_free(&out);
  raw[sizeof raw - 13] = 4; /* the second call's number, low byte: 6 -> 4 */
  send_bytes(fds[2], raw, sizeof raw, "rank 2's malformed STATS");
  expect_closed(fds[2], "rank 2 after a malformed STATS");
  expect_notice(fds[0], HOOP_ERR_PEER_LOST, 2, "rank 2 lost (rendezvous connection closed)",
                "rank 0");
  close(fds[2]);
  say_bye(fds[0], "rank 0");
  say_bye(fds[1], "rank 1");
}
END_TEST

/* Lateness by the clock where members share one. Four members, 40 calls each:
 * - All on one clock (its microseconds wrapping past 2^32 in the run): rank 2 comes 5 ms after
 *   rank 0, rank 3 0.3 ms after. Their waits say otherwise, as on a machine whose ranks outnumber
 *   its CPUs: in every other call rank 1 learned 4 ms late that the last one came. The view names
 *   rank 2 late by 5 ms, rank 3 by 0.3 ms, ranks 0 and 1 by nothing.
 * - On two clocks, ranks 0 and 1 on one, 2 and 3 on another that reads 2^31 us apart: between
 *   them only the first-comers' waits compare (rank 2, first on its clock, waited 1 ms less than
 *   rank 0: 1 ms late), within each the clock (rank 3 came 2 ms after rank 2: 3 ms late; rank 1
 *   0.5 ms after rank 0, with a noisy wait that does not count).
 * Each again with its last rank, which waited not at all, saying not when it came: it came when
 * the first on its clock to see the call through saw it (rank 0 at 5 ms; rank 2 at 1 + 2 ms). */
START_TEST(test_stats_view_by_clock) {
  static const struct {
    const char *job;
    uint64_t clock[4];
    uint32_t offset[4]; /* each clock's reading at the same moment, less rank 0's */
    uint32_t came[4], waited[4], noise[4], want[4];
    int last; /* the rank that came last, which in the second run says not when it came */
  } cases[] = {
      {"one-clock",
       {77, 77, 77, 77},
       {0, 0, 0, 0},
       {0, 0, 5000, 300},
       {5000, 5000, 0, 4700},
       {0, 4000, 0, 0},
       {0, 0, 5000, 300},
       2},
      {"two-clocks",
       {77, 77, 99, 99},
       {0, 0, 1u << 31, 1u << 31},
       {0, 500, 1000, 3000},
       {3000, 2500, 2000, 0},
       {0, 3000, 0, 0},
       {0, 500, 1000, 3000},
       3},
  };
  for (int unsaid = 0; unsaid < 2; unsaid++) {
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
      char job[32];
      snprintf(job, sizeof job, "%s%s", cases[k].job, unsaid ? "-unsaid" : "");
      int fds[4];
      join_running(job, 4, fds);
      hoop__view_msg view;
      for (int r = 0; r < 4; r++) {
        uint32_t waited[40], came[40];
        for (uint32_t i = 0; i < 40; i++) {
          came[i] = unsaid && r == cases[k].last
                        ? 0
                        : 0xfffe0000u + i * 20000 + cases[k].offset[r] + cases[k].came[r];
          waited[i] = cases[k].waited[r] + (i % 2) * cases[k].noise[r];
        }
        send_samples(fds[r], 1, 40, waited, cases[k].clock[r], came, -1, 0, job);
        expect_view_of(fds[r], 4, &view, job);
      }
      ck_assert_msg(view.calls == 40 && view.nlate == 4, "%s: %u calls, %u ranks named", job,
                    view.calls, view.nlate);
      for (uint32_t i = 0; i < 4; i++) {
        uint32_t r = view.late[i].rank;
        ck_assert_msg(r < 4 && view.late[i].median_us == cases[k].want[r] &&
                          view.late[i].max_us == cases[k].want[r],
                      "%s: rank %u late %u us (max %u), expected %u", job, r,
                      view.late[i].median_us, view.late[i].max_us, r < 4 ? cases[k].want[r] : 0);
      }
      ck_assert_msg(view.late[0].rank == (uint32_t)cases[k].last, "%s: rank %u named first", job,
                    view.late[0].rank);
      for (int r = 0; r < 4; r++)
        say_bye(fds[r], job);
    }
  }
}
END_TEST

/* A shrink starts the job's health afresh: the health of 3 ranks (rank 2 late, a link from rank
 * 2) is not shown for the 2 left, whose status still encodes (a health naming rank 2 of a job of
 * 2 would not); a STATS naming a link from a rank outside the job has it dropped, and the VIEW
 * the members get decodes at the new size. */
START_TEST(test_shrink_forgets_health) {
  int fds[3];
  uint32_t late[3] = {0, 0, 3000};
  join_running("shrunk", 3, fds);
  hoop__view_msg view;
  for (int i = 0; i < 3; i++) {
    send_stats(fds[i], 1, 20, 9000, late[i], i == 0 ? 2 : -1, 40000, "a member");
    expect_view(fds[i], &view, "a member");
  }
  close(fds[2]);
  expect_notice(fds[0], HOOP_ERR_PEER_LOST, 2, "rank 2 lost (rendezvous connection closed)",
                "rank 0");
  expect_notice(fds[1], HOOP_ERR_PEER_LOST, 2, "rank 2 lost (rendezvous connection closed)",
                "rank 1");
  send_shrink(fds[0], 0, JOB_TIMEOUT_MS);
  send_shrink(fds[1], 1, JOB_TIMEOUT_MS);
  for (int i = 0; i < 2; i++) {
    uint8_t *payload;
    uint32_t len;
    hoop__table table;
    uint16_t type = read_message(fds[i], &payload, &len, "a survivor", "the next TABLE");
    ck_assert(type == HOOP_MSG_TABLE && hoop__wire_decode_table(payload, len, &table) == 0);
    ck_assert_uint_eq(table.size, 2);
    hoop__table_free(&table);
    free(payload);
  }
  hoop__status status;
  query_status(&status); /* fails the test if the server cannot encode it */
  const hoop__job_status *job = status_job(&status, "shrunk");
  ck_assert_msg(job && job->health.running && job->health.reporting == 0 && job->health.nlate == 0,
                "status after the shrink: expected the job running with no health yet");
  hoop__status_free(&status);
  send_stats(fds[0], 1, 20, 9000, 0, 2, 40000, "rank 0 of 2"); /* a link from no rank of 2 */
  uint8_t *payload;
  uint32_t len;
  uint16_t type = read_message(fds[0], &payload, &len, "rank 0 of 2", "a VIEW");
  ck_assert_msg(type == HOOP_MSG_VIEW && hoop__wire_decode_view(payload, len, 2, &view) == 0 &&
                    view.nlinks == 0,
                "rank 0 of 2: expected a VIEW of the new size without the link from rank 2");
  free(payload);
  say_bye(fds[0], "rank 0");
  say_bye(fds[1], "rank 1");
}
END_TEST

/* hoopd --dump's exchange: a DUMP_REQ for a running job sends every member DUMP; their FLIGHTs
 * come back in the DUMP_REPLY by rank (the silent one named so, after 5 s); a second DUMP_REQ on
 * the same connection (the same proof would serve) is never read, and the server serves on. */
START_TEST(test_dump_exchange) {
  int fds[3];
  join_running("dumped", 3, fds);
  int asker = connect_server();
  hoop__dump_req req = {.job = "dumped"};
  hoop__wbuf wb = {0};
  ck_assert_int_eq(hoop__wire_encode_dump_req(&wb, &req), 0);
  send_bytes(asker, wb.data, wb.len, "the dump request");
  for (int i = 0; i < 2; i++) { /* rank 2 stays silent */
    uint8_t *payload;
    uint32_t len;
    uint16_t type = read_message(fds[i], &payload, &len, "a member", "a DUMP");
    ck_assert_msg(type == HOOP_MSG_DUMP && len == 0, "member %d: expected a DUMP, got %u", i, type);
    free(payload);
    if (i == 0) /* the members were asked: a second request on the asker's connection */
      send_bytes(asker, wb.data, wb.len, "a second dump request");
    char text[64];
    snprintf(text, sizeof text, "rank %d: in hoop_allreduce\n", i);
    hoop__wbuf flight = {0};
    ck_assert_int_eq(hoop__wire_encode_flight(&flight, text), 0);
    send_bytes(fds[i], flight.data, flight.len, "a FLIGHT");
    hoop__wbuf_free(&flight);
  }
  hoop__wbuf_free(&wb);
  uint8_t *payload;
  uint32_t len;
  uint16_t type = read_message(asker, &payload, &len, "the asker", "a DUMP_REPLY");
  hoop__dump_reply reply;
  ck_assert_msg(type == HOOP_MSG_DUMP_REPLY &&
                    hoop__wire_decode_dump_reply(payload, len, &reply) == 0 && reply.n == 3,
                "expected a DUMP_REPLY of 3 ranks, got type %u", type);
  free(payload);
  ck_assert(strcmp(reply.entries[1].text, "rank 1: in hoop_allreduce\n") == 0);
  ck_assert_msg(strstr(reply.entries[2].text, "no answer within"), "rank 2's entry: '%s'",
                reply.entries[2].text);
  hoop__dump_reply_free(&reply);
  expect_closed(asker, "the asker, once answered");
  close(asker);
  /* Rank 2 answers late: nothing happens; the server still answers a status query. */
  uint8_t *dump_payload;
  uint32_t dump_len;
  ck_assert_int_eq(read_message(fds[2], &dump_payload, &dump_len, "rank 2", "a DUMP"),
                   HOOP_MSG_DUMP);
  free(dump_payload);
  ck_assert_int_eq(hoop__wire_encode_flight(&wb, "late"), 0);
  send_bytes(fds[2], wb.data, wb.len, "a late FLIGHT");
  hoop__wbuf_free(&wb);
  ck_assert(job_listed("dumped") == 0);
  for (int i = 0; i < 3; i++)
    say_bye(fds[i], "a member");
}
END_TEST

static TCase *add_case(Suite *s, const char *name, int fixture) {
  TCase *tc = tcase_create(name);
  tcase_add_checked_fixture(tc, fixture ? start_default_server : NULL, stop_server);
  tcase_set_timeout(tc, 30);
  suite_add_tcase(s, tc);
  return tc;
}

/* A data connection's proof is bound to its transport, both ends, the stream, the generation and
 * the job's key, and keyed by the pair's secret: bytes seen on one link are refused on any other,
 * no key is among them, and no third rank can make the proof of a pair it is not in. */
typedef struct keyed_rank {
  uint8_t key_public[HOOP__AUTH_KEY], key_secret[HOOP__AUTH_KEY];
  hoop__keyring ring;
  hoop__tctx ctx;
} keyed_rank;

static void keyed_ranks(keyed_rank *ranks, int n, hoop__table *table, const uint8_t *nonce) {
  for (int r = 0; r < n; r++) {
    ck_assert_int_eq(hoop__auth_keypair(ranks[r].key_public, ranks[r].key_secret), 0);
    memcpy(table->peers[r].key, ranks[r].key_public, HOOP__AUTH_KEY);
  }
  for (int r = 0; r < n; r++)
    ranks[r].ctx = (hoop__tctx){.rank = r,
                                .size = n,
                                .table = table,
                                .data_nonce = nonce,
                                .key_public = ranks[r].key_public,
                                .key_secret = ranks[r].key_secret,
                                .keyring = &ranks[r].ring};
}

START_TEST(test_link_proof_binding) {
  uint8_t nonce[HOOP__WIRE_NONCE], other_nonce[HOOP__WIRE_NONCE];
  memset(nonce, 7, sizeof nonce);
  memset(other_nonce, 8, sizeof other_nonce);
  hoop__peer_entry peers[4] = {0};
  hoop__table table = {.size = 4, .peers = peers, .generation = 0};
  hoop__table next = {.size = 4, .peers = peers, .generation = 1};
  keyed_rank ranks[4];
  memset(ranks, 0, sizeof ranks);
  keyed_ranks(ranks, 4, &table, nonce);
  const hoop__tctx *one = &ranks[1].ctx, *two = &ranks[2].ctx;
  uint8_t proof[HOOP__WIRE_NONCE];
  hoop__link_proof(one, "tcp", 1, 2, 0, proof);
  ck_assert(memcmp(proof, nonce, sizeof proof) != 0);
  ck_assert(hoop__link_proof_ok(two, "tcp", 1, 2, 0, proof));
  ck_assert(hoop__link_proof_ok(one, "tcp", 1, 2, 0, proof));            /* both ends compute it */
  ck_assert(!hoop__link_proof_ok(two, "tcp", 2, 1, 0, proof));           /* the other way round */
  ck_assert(!hoop__link_proof_ok(&ranks[3].ctx, "tcp", 1, 3, 0, proof)); /* another receiver */
  ck_assert(!hoop__link_proof_ok(two, "tcp", 0, 2, 0, proof));           /* another sender */
  ck_assert(!hoop__link_proof_ok(two, "tcp", 1, 2, 1, proof));           /* another stream */
  ck_assert(!hoop__link_proof_ok(two, "shm", 1, 2, 0, proof));           /* another transport */
  hoop__tctx later = *two;
  later.table = &next;
  ck_assert(!hoop__link_proof_ok(&later, "tcp", 1, 2, 0, proof)); /* another generation */
  hoop__tctx stranger = *two;
  stranger.data_nonce = other_nonce;
  ck_assert(!hoop__link_proof_ok(&stranger, "tcp", 1, 2, 0, proof)); /* another job's key */
  /* Rank 3 is a member with the job's key, but not of the pair: what it makes for 1 -> 2 is
   * refused, and so is rank 1's proof checked with rank 3's key pair in rank 1's place. */
  uint8_t forged[HOOP__WIRE_NONCE];
  hoop__link_proof(&ranks[3].ctx, "tcp", 1, 2, 0, forged);
  ck_assert(!hoop__link_proof_ok(two, "tcp", 1, 2, 0, forged));
  hoop__tctx impostor = *one;
  impostor.key_public = ranks[3].key_public;
  impostor.key_secret = ranks[3].key_secret;
  hoop__keyring impostor_ring = {0};
  impostor.keyring = &impostor_ring;
  hoop__link_proof(&impostor, "tcp", 1, 2, 0, forged);
  ck_assert(!hoop__link_proof_ok(two, "tcp", 1, 2, 0, forged));
  /* The reply and the seal keys: each way its own, both ends alike. */
  uint8_t reply[HOOP__AUTH_PROOF], checked[HOOP__AUTH_PROOF], back[HOOP__AUTH_PROOF];
  const uint8_t hello[4] = {1, 2, 3, 4};
  ck_assert_int_eq(hoop__link_mac(two, HOOP__AUTH_REPLY, "tcp", 2, 1, 0, hello, 4, reply), 0);
  ck_assert_int_eq(hoop__link_mac(one, HOOP__AUTH_REPLY, "tcp", 2, 1, 0, hello, 4, checked), 0);
  ck_assert(memcmp(reply, checked, sizeof reply) == 0);
  ck_assert_int_eq(hoop__link_mac(one, HOOP__AUTH_SEAL, "tcp", 1, 2, 0, hello, 4, checked), 0);
  ck_assert_int_eq(hoop__link_mac(one, HOOP__AUTH_SEAL, "tcp", 2, 1, 0, hello, 4, back), 0);
  ck_assert(memcmp(checked, back, sizeof back) != 0);
  ck_assert(memcmp(reply, checked, sizeof reply) != 0);
  ck_assert_int_eq(hoop__link_mac(&ranks[3].ctx, HOOP__AUTH_SEAL, "tcp", 1, 2, 0, hello, 4, back),
                   -1);
  for (int r = 0; r < 4; r++)
    hoop__keyring_free(&ranks[r].ring);
  hoop__keyring_free(&impostor_ring);
}
END_TEST

static Suite *rdzv_suite(void) {
  Suite *s = suite_create("rdzv");
  TCase *tc = add_case(s, "assignment", 1);
  tcase_add_test(tc, test_hosts_get_contiguous_ranks);
  tcase_add_test(tc, test_link_proof_binding);
  tcase_add_test(tc, test_requested_ranks_are_kept);
  tcase_add_test(tc, test_requested_and_assigned_mixed);
  tc = add_case(s, "refusals", 1);
  tcase_add_test(tc, test_size_mismatch_refused);
  tcase_add_test(tc, test_duplicate_rank_refused);
  tc = add_case(s, "timeouts", 1);
  tcase_add_test(tc, test_timeout_names_missing_ranks);
  tcase_add_test(tc, test_timeout_names_joined_hosts);
  tc = add_case(s, "leaving", 1);
  tcase_add_test(tc, test_leaving_member_is_replaced);
  tcase_add_test(tc, test_abandoned_job_is_forgotten);
  tcase_add_test(tc, test_bytes_after_hello_drop_that_member);
  tc = add_case(s, "malformed", 1);
  tcase_add_test(tc, test_malformed_requests_close_only_their_connection);
  tc = add_case(s, "status", 1);
  tcase_add_test(tc, test_status_lists_waiting_jobs);
  tcase_add_test(tc, test_status_without_jobs);
  tc = add_case(s, "jobs", 1);
  tcase_add_test(tc, test_two_jobs_at_once);
  tc = add_case(s, "limits", 0);
  tcase_add_test(tc, test_connection_limit);
  tcase_add_test(tc, test_idle_limit_per_address);
  tcase_add_test(tc, test_shrink_timeout_zero_waits_for_the_others);
  tcase_add_test(tc, test_job_limit);
  tcase_add_test(tc, test_idle_connection_closed);
  tcase_add_test(tc, test_member_outlives_idle_timeout);
  tcase_add_test(tc, test_once_after_table);
  tcase_add_test(tc, test_once_after_timeout);
  tc = add_case(s, "server", 0);
  tcase_add_test(tc, test_ipv6_listen);
  tcase_add_test(tc, test_bad_listen_address_refused);
  tc = add_case(s, "auth", 0);
  tcase_add_test(tc, test_challenge_says_whether_a_token_is_needed);
  tcase_add_test(tc, test_proven_ranks_join);
  tcase_add_test(tc, test_bad_proofs_refused_and_job_unharmed);
  tcase_add_test(tc, test_status_needs_the_token);
  tc = add_case(s, "kept", 1);
  tcase_add_test(tc, test_member_abort_relayed);
  tcase_add_test(tc, test_abort_in_another_name_refused);
  tcase_add_test(tc, test_bye_quiet_close_lost);
  tcase_add_test(tc, test_member_garbage_closes_only_it);
  tcase_add_test(tc, test_abort_before_join_refused);
  tcase_add_test(tc, test_running_job_frees_its_id);
  tcase_add_test(tc, test_stats_view_and_health);
  tcase_add_test(tc, test_stats_view_by_clock);
  tcase_add_test(tc, test_shrink_forgets_health);
  tcase_add_test(tc, test_dump_exchange);
  tc = add_case(s, "kept_own_server", 0);
  tcase_add_test(tc, test_abort_after_failed_proof_refused);
  tcase_add_test(tc, test_once_waits_for_members);
  tc = add_case(s, "stop", 1);
  tcase_add_test(tc, test_stop_with_clients_connected);
  return s;
}

int main(void) {
  /* The server warns about every malformed request these tests send on purpose; HOOP_DEBUG still
   * shows them when asked for. */
  if (!getenv("HOOP_DEBUG"))
    hoop__log_set(HOOP_LOG_ERROR, HOOP_SUBSYS_ALL);
  SRunner *sr = srunner_create(rdzv_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
