/* client.c - client side of the rendezvous: connect to the server (retrying while it starts),
 * take its challenge, send HELLO (with a proof of the token when there is one) and wait for the
 * rank table or the server's error; then keep the connection for ABORT, BYE and the server's
 * NOTICEs. */
#include "rdzv/client.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rdzv/state.h"
#include "util/netaddr.h"
#include "util/sockio.h"

/* Extra time to wait past our own timeout, so that the server's timeout message (which names the
 * missing ranks) reaches us before we give up on our own. */
#define RDZV_GRACE_S 5.0
/* How long hoop_abort and hoop_finalize may wait to hand the server their few bytes: a server
 * that is gone or stuck must not hold up an abort. */
#define RDZV_GOODBYE_WAIT_S 1.0

/* How long a rank waits for the server's greeting on a connection before it connects again. A
 * server greets a connection as soon as it accepts it; one it never accepted (a kernel whose
 * accept queue was full when the connection's last ACK came, SYN cookies making it look connected
 * on this side: listen backlogs capped at a low net.core.somaxconn) would otherwise hold the rank
 * until its timeout. */
#define GREET_WAIT_S 5.0

/* Connect, retrying every 100 ms while nothing listens yet: ranks may start before the server
 * (rank 0 may be the one hosting it). */
static int connect_with_retry(const struct sockaddr *server, socklen_t len, double deadline) {
  for (;;) {
    int fd = hoop__connect_deadline(server, len, deadline);
    if (fd >= 0)
      return fd;
    if (errno != ECONNREFUSED && errno != ECONNRESET && errno != ENETUNREACH &&
        errno != EHOSTUNREACH)
      return -1;
    if (hoop__now() + 0.1 >= deadline) {
      errno = ETIMEDOUT;
      return -1;
    }
    struct timespec pause = {0, 100 * 1000 * 1000};
    nanosleep(&pause, NULL);
  }
}

/* Read one whole message; *payload is malloc'ed (may be NULL for an empty payload). */
static int read_message(int fd, size_t max_payload, double deadline, hoop__wire_header *header,
                        uint8_t **payload) {
  uint8_t head[HOOP__WIRE_HEADER_SIZE];
  *payload = NULL;
  if (hoop__read_full(fd, head, sizeof head, deadline) != 0)
    return -1;
  if (hoop__wire_decode_header(head, sizeof head, max_payload, header) != 0) {
    errno = EPROTO;
    return -1;
  }
  if (header->length == 0)
    return 0;
  *payload = malloc(header->length);
  if (!*payload)
    return -1;
  if (hoop__read_full(fd, *payload, header->length, deadline) != 0) {
    int saved = errno;
    free(*payload);
    *payload = NULL;
    errno = saved;
    return -1;
  }
  return 0;
}

/* A server's ERROR as a result code and message. */
static hoop_result server_error(const hoop__wire_header *header, const uint8_t *payload,
                                const char *where, char *err, size_t errlen) {
  hoop__error_msg error;
  if (hoop__wire_decode_error(payload, header->length, &error) != 0) {
    snprintf(err, errlen, "rendezvous: malformed error from %s", where);
    return HOOP_ERR_PROTOCOL;
  }
  snprintf(err, errlen, "rendezvous server %s: %s", where, error.message);
  return error.code > 0 && error.code <= HOOP_ERR_FAILED ? (hoop_result)error.code
                                                         : HOOP_ERR_PROTOCOL;
}

/* The server speaks first: read its CHALLENGE (or the ERROR of a server that refuses us at once)
 * and check that it asks for a proof exactly when we hold a token. A token with a server that asks
 * for none is refused too: whoever set one expects strangers kept out, and this server would
 * not. */
static hoop_result read_challenge(int fd, double deadline, const char *token, const char *where,
                                  hoop__challenge *challenge, char *err, size_t errlen) {
  hoop__wire_header header;
  uint8_t *payload = NULL;
  hoop_result result = HOOP_OK;
  if (read_message(fd, HOOP__WIRE_MAX_PAYLOAD, deadline, &header, &payload) != 0) {
    int failure = errno; /* before snprintf, which may change it */
    snprintf(err, errlen, "rendezvous: waiting for %s to greet us: %s", where,
             failure == EPROTO ? "malformed message (is it a hoop rendezvous server of this "
                                 "version?)"
                               : strerror(failure));
    result = failure == ETIMEDOUT ? HOOP_ERR_TIMEOUT
             : failure == EPROTO  ? HOOP_ERR_PROTOCOL
                                  : HOOP_ERR_SYSTEM;
  } else if (header.type == HOOP_MSG_ERROR) {
    result = server_error(&header, payload, where, err, errlen);
  } else if (header.type != HOOP_MSG_CHALLENGE ||
             hoop__wire_decode_challenge(payload, header.length, challenge) != 0) {
    snprintf(err, errlen, "rendezvous: %s opened with a malformed or unexpected message (type %u)",
             where, header.type);
    result = HOOP_ERR_PROTOCOL;
  } else if ((challenge->flags & HOOP__CHALLENGE_AUTH) && !token[0]) {
    snprintf(err, errlen,
             "rendezvous server %s requires a token: set HOOP_TOKEN or "
             "HOOP_TOKEN_FILE to the one it was given (hooprun hands its ranks their job's token)",
             where);
    result = HOOP_ERR_AUTH;
  } else if (!(challenge->flags & HOOP__CHALLENGE_AUTH) && token[0]) {
    snprintf(err, errlen,
             "a token is set (HOOP_TOKEN or HOOP_TOKEN_FILE), but the rendezvous "
             "server %s asks for none, so it would admit anyone: not joining (give the server the "
             "token, e.g. hoopd --token-file, or unset it here)",
             where);
    result = HOOP_ERR_AUTH;
  }
  free(payload);
  return result;
}

static hoop_result send_hello(hoop_comm *comm, int fd, const hoop__hello *hello, double deadline,
                              const char *where) {
  hoop__wbuf out = {0};
  if (hoop__wire_encode_hello(&out, hello) != 0) {
    hoop__wbuf_free(&out);
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "rendezvous: cannot encode HELLO (job id or host name too long?)");
  }
  int rc = hoop__write_full(fd, out.data, out.len, deadline);
  int saved = errno;
  hoop__wbuf_free(&out);
  if (rc != 0)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "rendezvous: sending HELLO to %s: %s", where,
                           strerror(saved));
  return HOOP_OK;
}

/* Turn the server's reply into a table or a recorded error. */
static hoop_result take_reply(hoop_comm *comm, const hoop__wire_header *header,
                              const uint8_t *payload, const char *where, hoop__table *table) {
  if (header->type == HOOP_MSG_TABLE) {
    if (hoop__wire_decode_table(payload, header->length, table) != 0)
      return hoop__set_error(comm, HOOP_ERR_PROTOCOL, "rendezvous: malformed rank table from %s",
                             where);
    return HOOP_OK;
  }
  if (header->type == HOOP_MSG_ERROR) {
    char err[HOOP__WIRE_MAX_MESSAGE + 256];
    hoop_result code = server_error(header, payload, where, err, sizeof err);
    return hoop__set_error(comm, code, "%s", err);
  }
  return hoop__set_error(comm, HOOP_ERR_PROTOCOL, "rendezvous: unexpected message type %u from %s",
                         header->type, where);
}

/* With a token, the TABLE_PROOF after the table: the server's proof of the token over this rank's
 * HELLO nonce and the table as it came (payload, len bytes). Without it, whoever answered at the
 * server's address (someone who took it before the real server) may have forged the table. */
static hoop_result check_table_proof(hoop_comm *comm, int fd, double deadline,
                                     const uint8_t *hello_nonce, const uint8_t *payload, size_t len,
                                     const char *where) {
  hoop__wire_header header;
  uint8_t *message = NULL;
  hoop__table_proof got;
  uint8_t digest[HOOP__AUTH_PROOF], want[HOOP__AUTH_PROOF];
  int ok = len >= HOOP__WIRE_TABLE_OWN &&
           read_message(fd, HOOP__WIRE_MAX_PAYLOAD, deadline, &header, &message) == 0 &&
           header.type == HOOP_MSG_TABLE_PROOF &&
           hoop__wire_decode_table_proof(message, header.length, &got) == 0 &&
           got.proof_len == HOOP__AUTH_PROOF;
  free(message);
  if (ok) {
    hoop__auth_digest(payload + HOOP__WIRE_TABLE_OWN, len - HOOP__WIRE_TABLE_OWN, digest);
    hoop__auth_table_proof(comm->token, hello_nonce, payload, digest, want);
    ok = hoop__auth_equal(got.proof, want, sizeof want);
  }
  if (ok)
    return HOOP_OK;
  return hoop__set_error(comm, HOOP_ERR_AUTH,
                         "authentication failed: the rendezvous server at %s sent a rank table "
                         "without proving that it knows this job's token: someone else may hold "
                         "that address (a stranger that took the port first); its table is refused",
                         where);
}

hoop_result hoop__rendezvous_join(hoop_comm *comm, const struct sockaddr *server,
                                  socklen_t server_len, const hoop__hello *hello, double timeout_s,
                                  hoop__table *table) {
  char where[128];
  hoop__format_sockaddr(server, where, sizeof where);
  double start = hoop__now();
  double deadline = start + timeout_s + RDZV_GRACE_S;
  int fd = connect_with_retry(server, server_len, start + timeout_s);
  if (fd < 0) {
    if (errno == ETIMEDOUT)
      return hoop__set_error(comm, HOOP_ERR_TIMEOUT,
                             "rendezvous: no server answered at %s within %.1f s "
                             "(is hoopd running there, or rank 0 hosting it?)",
                             where, timeout_s);
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "rendezvous: connecting to %s: %s", where,
                           strerror(errno));
  }
  HOOP__INFO(HOOP_SUBSYS_RDZV, "connected to %s; joining job '%s' of %u ranks", where, hello->job,
             hello->size);
  hoop__challenge challenge;
  char err[HOOP__WIRE_MAX_MESSAGE + 256];
  hoop_result result;
  for (;;) {
    double greet_by = hoop__now() + GREET_WAIT_S;
    result = read_challenge(fd, greet_by < deadline ? greet_by : deadline, comm->token, where,
                            &challenge, err, sizeof err);
    if (result != HOOP_ERR_TIMEOUT || greet_by >= start + timeout_s)
      break;
    HOOP__INFO(HOOP_SUBSYS_RDZV,
               "%s has not greeted this connection within %.0f s: connecting again (a server "
               "whose accept queue was full may never have seen it)",
               where, GREET_WAIT_S);
    close(fd);
    if ((fd = connect_with_retry(server, server_len, start + timeout_s)) < 0)
      return hoop__set_error(comm, errno == ETIMEDOUT ? HOOP_ERR_TIMEOUT : HOOP_ERR_SYSTEM,
                             "rendezvous: connecting to %s again after %.0f s without its "
                             "greeting: %s",
                             where, GREET_WAIT_S, strerror(errno));
  }
  hoop__hello signed_hello = *hello;
  /* With a token, the nonce the server's TABLE_PROOF must answer (without one it stays zeros). */
  if (result != HOOP_OK) {
    hoop__set_error(comm, result, "%s", err);
  } else if (comm->token[0] &&
             hoop__auth_random(signed_hello.nonce, sizeof signed_hello.nonce) != 0) {
    result = hoop__set_error(comm, HOOP_ERR_SYSTEM, "rendezvous: no random bytes (libsodium)");
  } else if (comm->token[0]) {
    signed_hello.proof_len = HOOP__AUTH_PROOF;
    if (hoop__auth_hello_proof(comm->token, challenge.nonce, &signed_hello, signed_hello.proof) !=
        0)
      result = hoop__set_error(comm, HOOP_ERR_SYSTEM, "rendezvous: out of memory");
  }
  if (result == HOOP_OK)
    result = send_hello(comm, fd, &signed_hello, deadline, where);
  if (result == HOOP_OK) {
    hoop__wire_header header;
    uint8_t *payload = NULL;
    if (read_message(fd, HOOP__WIRE_MAX_PAYLOAD, deadline, &header, &payload) != 0) {
      if (errno == ETIMEDOUT)
        result = hoop__set_error(comm, HOOP_ERR_TIMEOUT,
                                 "rendezvous: job '%s' did not complete within %.1f s and the "
                                 "server at %s sent no reason",
                                 hello->job, timeout_s, where);
      else
        result = hoop__set_error(comm, errno == EPROTO ? HOOP_ERR_PROTOCOL : HOOP_ERR_SYSTEM,
                                 "rendezvous: waiting for the rank table from %s: %s", where,
                                 errno == EPROTO ? "malformed reply" : strerror(errno));
    } else {
      result = take_reply(comm, &header, payload, where, table);
      if (result == HOOP_OK && comm->token[0] &&
          (result = check_table_proof(comm, fd, deadline, signed_hello.nonce, payload,
                                      header.length, where)) != HOOP_OK)
        hoop__table_free(table);
    }
    free(payload);
  }
  if (result == HOOP_OK) {
    comm->rdzv_fd = fd; /* kept: see rdzv/client.h */
    hoop__hook_register(comm, HOOP__HOOK_ABORT, hoop__rendezvous_abort);
    comm->rdzv->inlen = 0;
    comm->rdzv->goodbye = 0;
  } else {
    close(fd);
  }
  return result;
}

/* ---- the kept connection ------------------------------------------------------------------- */

int hoop__rendezvous_fd(const hoop_comm *comm) {
  return comm->rdzv_fd;
}

/* Stop using the connection; aborts then travel on the data connections alone. */
void hoop__rendezvous_drop(hoop_comm *comm, const char *why) {
  HOOP__INFO(HOOP_SUBSYS_RDZV,
             "rendezvous connection: %s; no longer watched (notices of aborts "
             "still come over the data connections)",
             why);
  if (close(comm->rdzv_fd) != 0)
    HOOP__TRACE(HOOP_SUBSYS_RDZV, "closing the rendezvous connection: %s", strerror(errno));
  comm->rdzv_fd = -1;
  comm->rdzv->inlen = 0;
  snprintf(comm->rdzv->lost, sizeof comm->rdzv->lost, "%s", why);
}

/* A NOTICE from the server: another rank aborted or was lost. Its words are forwarded to the data
 * peers as they are, so that every rank says the same. */
static hoop_result take_notice(hoop_comm *comm, const hoop__notice *notice) {
  if (comm->failed)
    return comm->failed;
  hoop_result code = (hoop_result)notice->code;
  if ((code != HOOP_ERR_ABORTED && code != HOOP_ERR_PEER_LOST) ||
      notice->origin >= (uint32_t)comm->size || (int)notice->origin == comm->rank) {
    hoop__rendezvous_drop(comm, "a NOTICE with an unknown code or rank");
    return HOOP_OK;
  }
  comm->fail_origin = (int)notice->origin;
  snprintf(comm->fail_cause, sizeof comm->fail_cause, "%.1023s", notice->message);
  if (code == HOOP_ERR_ABORTED)
    return hoop__fail(comm, code, "%s (relayed by the rendezvous server)", notice->message);
  return hoop__fail(comm, code, "%s (call #%llu): %s, told by the rendezvous server",
                    comm->call ? comm->call : "hoop", (unsigned long long)comm->seq,
                    notice->message);
}

/* The whole messages in comm->rdzv->in: HOOP_OK, or the failure a NOTICE caused. */
static hoop_result take_messages(hoop_comm *comm) {
  while (comm->rdzv_fd >= 0) {
    hoop__wire_header header;
    int rc = hoop__wire_decode_header(comm->rdzv->in, comm->rdzv->inlen,
                                      HOOP__WIRE_MAX_NOTICE_PAYLOAD, &header);
    if (rc == 1 || (rc == 0 && comm->rdzv->inlen < HOOP__WIRE_HEADER_SIZE + header.length))
      return HOOP_OK;
    hoop__notice notice;
    uint32_t newcomers;
    if (rc == 0 && header.type == HOOP_MSG_PENDING &&
        hoop__wire_decode_pending(comm->rdzv->in + HOOP__WIRE_HEADER_SIZE, header.length,
                                  &newcomers) == 0) {
      atomic_store(&comm->rdzv->newcomers, newcomers > INT32_MAX ? INT32_MAX : (int)newcomers);
      size_t total = HOOP__WIRE_HEADER_SIZE + header.length;
      memmove(comm->rdzv->in, comm->rdzv->in + total, comm->rdzv->inlen - total);
      comm->rdzv->inlen -= total;
      continue;
    }
    if (rc == 0 && (header.type == HOOP_MSG_VIEW || header.type == HOOP_MSG_DUMP)) {
      if (header.type == HOOP_MSG_VIEW)
        hoop__rendezvous_take_view(comm, comm->rdzv->in + HOOP__WIRE_HEADER_SIZE, header.length);
      else
        hoop__rendezvous_take_dump(comm, header.length);
      if (comm->rdzv_fd < 0) /* dropped: it was malformed, or the answer could not go */
        return HOOP_OK;
      size_t total = HOOP__WIRE_HEADER_SIZE + header.length;
      memmove(comm->rdzv->in, comm->rdzv->in + total, comm->rdzv->inlen - total);
      comm->rdzv->inlen -= total;
      continue;
    }
    if (rc == 0 && header.type == HOOP_MSG_ERROR) {
      /* Left out of a shrink by the other ranks: this communicator is over. */
      char err[HOOP__WIRE_MAX_MESSAGE + 256];
      hoop_result code = server_error(&header, comm->rdzv->in + HOOP__WIRE_HEADER_SIZE,
                                      comm->rendezvous, err, sizeof err);
      /* Kept as the reason the connection went: a failure seen first (a peer's data connection
       * closing as the others go on without this rank) hides it, and the shrink that follows
       * must still say that this rank is out of the job. */
      hoop__rendezvous_drop(comm, err);
      comm->rdzv->lost_code = code;
      if (comm->failed)
        return comm->failed;
      return hoop__fail(comm, code, "%s: %s", comm->call ? comm->call : "hoop", err);
    }
    if (rc < 0 || header.type != HOOP_MSG_NOTICE ||
        hoop__wire_decode_notice(comm->rdzv->in + HOOP__WIRE_HEADER_SIZE, header.length, &notice) !=
            0) {
      hoop__rendezvous_drop(comm, "the server sent a malformed or unexpected message");
      return HOOP_OK;
    }
    size_t total = HOOP__WIRE_HEADER_SIZE + header.length;
    memmove(comm->rdzv->in, comm->rdzv->in + total, comm->rdzv->inlen - total);
    comm->rdzv->inlen -= total;
    hoop_result result = take_notice(comm, &notice);
    if (result != HOOP_OK)
      return result;
  }
  return HOOP_OK;
}

hoop_result hoop__rendezvous_check(hoop_comm *comm) {
  /* What hoop__rendezvous_abort_pending read ahead, first. */
  if (comm->rdzv_fd >= 0 && comm->rdzv->inlen > 0) {
    hoop_result result = take_messages(comm);
    if (result != HOOP_OK)
      return result;
  }
  while (comm->rdzv_fd >= 0) {
    ssize_t n = recv(comm->rdzv_fd, comm->rdzv->in + comm->rdzv->inlen,
                     sizeof comm->rdzv->in - comm->rdzv->inlen, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return HOOP_OK;
    if (n <= 0) {
      char why[128];
      snprintf(why, sizeof why, "%s", n == 0 ? "closed by the server" : strerror(errno));
      /* What came before the close still counts (hoop__rendezvous_abort_pending reads ahead). */
      hoop_result result = take_messages(comm);
      if (comm->rdzv_fd >= 0)
        hoop__rendezvous_drop(comm, why);
      return result;
    }
    comm->rdzv->inlen += (size_t)n;
    hoop_result result = take_messages(comm);
    if (result != HOOP_OK)
      return result;
  }
  return HOOP_OK;
}

/* Read one whole message from the kept connection, taking first what the state's in[] already
 * holds; *payload is malloc'ed (NULL for an empty payload). 0, or -1 with errno set. */
static int read_kept_message(hoop_comm *comm, double deadline, hoop__wire_header *header,
                             uint8_t **payload) {
  *payload = NULL;
  if (comm->rdzv->inlen < HOOP__WIRE_HEADER_SIZE &&
      hoop__read_full(comm->rdzv_fd, comm->rdzv->in + comm->rdzv->inlen,
                      HOOP__WIRE_HEADER_SIZE - comm->rdzv->inlen, deadline) != 0)
    return -1;
  if (comm->rdzv->inlen < HOOP__WIRE_HEADER_SIZE)
    comm->rdzv->inlen = HOOP__WIRE_HEADER_SIZE;
  if (hoop__wire_decode_header(comm->rdzv->in, comm->rdzv->inlen, HOOP__WIRE_MAX_PAYLOAD, header) !=
      0) {
    errno = EPROTO;
    return -1;
  }
  size_t held = comm->rdzv->inlen - HOOP__WIRE_HEADER_SIZE;
  size_t from_held = held < header->length ? held : header->length;
  if (header->length > 0 && !(*payload = malloc(header->length)))
    return -1;
  if (from_held)
    memcpy(*payload, comm->rdzv->in + HOOP__WIRE_HEADER_SIZE, from_held);
  size_t used = HOOP__WIRE_HEADER_SIZE + from_held;
  memmove(comm->rdzv->in, comm->rdzv->in + used, comm->rdzv->inlen - used);
  comm->rdzv->inlen -= used;
  if (header->length > from_held && hoop__read_full(comm->rdzv_fd, *payload + from_held,
                                                    header->length - from_held, deadline) != 0) {
    int saved = errno;
    free(*payload);
    *payload = NULL;
    errno = saved;
    return -1;
  }
  return 0;
}

hoop_result hoop__rendezvous_shrink(hoop_comm *comm, const hoop__shrink_msg *msg, double deadline,
                                    hoop__table *table) {
  if (comm->rdzv_fd < 0 || comm->rdzv->goodbye)
    return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED,
                           "hoop_comm_shrink: this rank's rendezvous connection is gone (%s), and "
                           "the survivors agree through it",
                           comm->rdzv->goodbye ? "it aborted" : "the server closed it or was lost");
  hoop__wbuf out = {0};
  int rc = hoop__wire_encode_shrink(&out, msg);
  if (rc == 0)
    rc = hoop__write_full(comm->rdzv_fd, out.data, out.len, deadline);
  int saved = errno;
  hoop__wbuf_free(&out);
  if (rc != 0) {
    hoop__rendezvous_drop(comm, "sending SHRINK failed");
    return hoop__set_error(comm, HOOP_ERR_PEER_LOST,
                           "hoop_comm_shrink: cannot ask the rendezvous server: %s",
                           strerror(saved));
  }
  for (;;) {
    hoop__wire_header header;
    uint8_t *payload = NULL;
    if (read_kept_message(comm, deadline, &header, &payload) != 0) {
      int failure = errno;
      hoop_result code = failure == ETIMEDOUT ? HOOP_ERR_TIMEOUT
                         : failure == EPROTO  ? HOOP_ERR_PROTOCOL
                                              : HOOP_ERR_PEER_LOST;
      if (failure != ETIMEDOUT)
        hoop__rendezvous_drop(comm, "lost while shrinking");
      return hoop__set_error(
          comm, code, "hoop_comm_shrink: waiting for the rendezvous server's new table: %s",
          failure == ETIMEDOUT ? "no answer within the timeout"
          : failure == EPROTO  ? "malformed message"
          : failure == ECONNRESET
              ? "the server closed the connection (a server of an older version of hoop?)"
              : strerror(failure));
    }
    hoop_result result = HOOP_OK;
    /* NOTICEs are about the old generation, known already, as are VIEWs; PENDING counts are
     * taken in. */
    if (header.type == HOOP_MSG_NOTICE || header.type == HOOP_MSG_PENDING ||
        header.type == HOOP_MSG_VIEW || header.type == HOOP_MSG_DUMP) {
      free(payload);
      continue;
    }
    result = take_reply(comm, &header, payload, comm->rendezvous, table);
    free(payload);
    if (result != HOOP_OK && header.type == HOOP_MSG_ERROR) {
      /* The server's words and code stay the reason, for a later shrink's error. */
      hoop__rendezvous_drop(comm, comm->last_error);
      comm->rdzv->lost_code = result;
    } else if (result != HOOP_OK) {
      hoop__rendezvous_drop(comm, "an unexpected message while shrinking");
    }
    return result;
  }
}

/* Write one message (encoded: 0 from its encoder) to the server within RDZV_GOODBYE_WAIT_S; -1
 * (logged) if it could not. */
static int send_goodbye(hoop_comm *comm, int encoded, const hoop__wbuf *out, const char *what) {
  if (encoded != 0) {
    HOOP__WARN(HOOP_SUBSYS_RDZV, "cannot encode the %s for the rendezvous server", what);
    return -1;
  }
  if (hoop__write_full(comm->rdzv_fd, out->data, out->len, hoop__now() + RDZV_GOODBYE_WAIT_S) !=
      0) {
    HOOP__INFO(HOOP_SUBSYS_RDZV, "could not send the %s to the rendezvous server: %s", what,
               strerror(errno));
    return -1;
  }
  return 0;
}

void hoop__rendezvous_abort(hoop_comm *comm) {
  if (comm->rdzv_fd < 0 || comm->rdzv->goodbye)
    return;
  hoop__abort_msg msg = {.rank = (uint32_t)comm->rank};
  snprintf(msg.reason, sizeof msg.reason, "%s", comm->abort_reason);
  hoop__wbuf out = {0};
  if (send_goodbye(comm, hoop__wire_encode_abort(&out, &msg), &out, "ABORT") == 0)
    comm->rdzv->goodbye = 1;
  hoop__wbuf_free(&out);
}

void hoop__rendezvous_leave(hoop_comm *comm) {
  if (comm->rdzv_fd < 0)
    return;
  if (!comm->rdzv->goodbye) {
    hoop__wbuf out = {0};
    send_goodbye(comm, hoop__wire_encode_bye(&out), &out, "BYE");
    hoop__wbuf_free(&out);
  }
  if (close(comm->rdzv_fd) != 0)
    HOOP__TRACE(HOOP_SUBSYS_RDZV, "closing the rendezvous connection: %s", strerror(errno));
  comm->rdzv_fd = -1;
}

/* One request on a connection of its own (a status query, a dump): connect, take the challenge,
 * send what make encodes with the proof of the token for purpose over the challenge (none without
 * a token), and read one reply of type want: HOOP_OK with *payload (malloc'ed, NULL when empty)
 * and its length; else the error in err. */
typedef int (*request_maker)(hoop__wbuf *out, const uint8_t *proof, uint16_t proof_len,
                             const void *arg);

static hoop_result one_request(const struct sockaddr *server, socklen_t server_len,
                               double timeout_s, const char *token, const char *purpose,
                               request_maker make, const void *arg, uint16_t want, const char *what,
                               uint8_t **payload, uint32_t *len, char *err, size_t errlen) {
  char where[128];
  hoop__format_sockaddr(server, where, sizeof where);
  double deadline = hoop__now() + timeout_s;
  *payload = NULL;
  int fd = hoop__connect_deadline(server, server_len, deadline);
  if (fd < 0) {
    snprintf(err, errlen, "cannot connect to %s: %s", where, strerror(errno));
    return HOOP_ERR_SYSTEM;
  }
  hoop__challenge challenge;
  hoop_result result =
      read_challenge(fd, deadline, token ? token : "", where, &challenge, err, errlen);
  if (result != HOOP_OK) {
    close(fd);
    return result;
  }
  uint8_t proof[HOOP__AUTH_PROOF];
  uint16_t proof_len = 0;
  if (token && token[0]) {
    proof_len = HOOP__AUTH_PROOF;
    hoop__auth_proof(token, strlen(token), purpose, challenge.nonce, HOOP__WIRE_CHALLENGE, NULL, 0,
                     proof);
  }
  result = HOOP_ERR_SYSTEM;
  hoop__wbuf out = {0};
  hoop__wire_header header;
  if (make(&out, proof, proof_len, arg) != 0 ||
      hoop__write_full(fd, out.data, out.len, deadline) != 0 ||
      read_message(fd, HOOP__WIRE_MAX_PAYLOAD, deadline, &header, payload) != 0) {
    snprintf(err, errlen, "%s to %s: %s", what, where,
             errno == EPROTO ? "malformed reply" : strerror(errno));
  } else if (header.type == HOOP_MSG_ERROR) {
    result = server_error(&header, *payload, where, err, errlen);
  } else if (header.type != want) {
    snprintf(err, errlen, "%s to %s: unexpected reply", what, where);
    result = HOOP_ERR_PROTOCOL;
  } else {
    *len = header.length;
    result = HOOP_OK;
  }
  if (result != HOOP_OK) {
    free(*payload);
    *payload = NULL;
  }
  hoop__wbuf_free(&out);
  close(fd);
  return result;
}

static int make_status_req(hoop__wbuf *out, const uint8_t *proof, uint16_t proof_len,
                           const void *arg) {
  (void)arg;
  hoop__status_req request = {.proof_len = proof_len};
  memcpy(request.proof, proof, proof_len);
  return hoop__wire_encode_status_req(out, &request);
}

hoop_result hoop__rendezvous_status(const struct sockaddr *server, socklen_t server_len,
                                    double timeout_s, const char *token, hoop__status *status,
                                    char *err, size_t errlen) {
  uint8_t *payload;
  uint32_t len = 0;
  hoop_result result =
      one_request(server, server_len, timeout_s, token, HOOP__AUTH_STATUS, make_status_req, NULL,
                  HOOP_MSG_STATUS, "status query", &payload, &len, err, errlen);
  if (result == HOOP_OK && hoop__wire_decode_status(payload, len, status) != 0) {
    snprintf(err, errlen, "status query: malformed reply");
    result = HOOP_ERR_PROTOCOL;
  }
  free(payload);
  return result;
}

static int make_dump_req(hoop__wbuf *out, const uint8_t *proof, uint16_t proof_len,
                         const void *arg) {
  hoop__dump_req request = {.proof_len = proof_len};
  memcpy(request.proof, proof, proof_len);
  snprintf(request.job, sizeof request.job, "%s", (const char *)arg);
  return hoop__wire_encode_dump_req(out, &request);
}

hoop_result hoop__rendezvous_dump(const struct sockaddr *server, socklen_t server_len,
                                  double timeout_s, const char *token, const char *job,
                                  hoop__dump_reply *reply, char *err, size_t errlen) {
  uint8_t *payload;
  uint32_t len = 0;
  int control = 0;
  for (const unsigned char *p = (const unsigned char *)job; *p; p++)
    control |= *p < 0x20 || *p == 0x7f;
  if (!job[0] || strlen(job) > HOOP__WIRE_MAX_JOB || control) {
    snprintf(err, errlen, "not a job id: 1 to %d bytes, no control characters", HOOP__WIRE_MAX_JOB);
    return HOOP_ERR_INVALID_ARG;
  }
  hoop_result result =
      one_request(server, server_len, timeout_s, token, HOOP__AUTH_DUMP, make_dump_req, job,
                  HOOP_MSG_DUMP_REPLY, "dump request", &payload, &len, err, errlen);
  if (result == HOOP_OK && hoop__wire_decode_dump_reply(payload, len, reply) != 0) {
    snprintf(err, errlen, "dump request: malformed reply");
    result = HOOP_ERR_PROTOCOL;
  }
  free(payload);
  return result;
}
