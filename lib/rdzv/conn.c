/* conn.c - the rendezvous server's client connections: the CHALLENGE that opens each, replies and
 * their writes, reading, idle deadlines, keepalive, accepting and closing. */
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "rdzv/server_impl.h"
#include "util/hash.h"
#include "util/netaddr.h"

/* ---- replies --------------------------------------------------------------------------------- */

void hoop__rdzv_shared_table_release(shared_table *shared) {
  if (--shared->refs == 0) {
    hoop__wbuf_free(&shared->wire);
    free(shared);
  }
}

void hoop__rdzv_reply_free(rdzv_reply *reply) {
  hoop__wbuf_free(&reply->message);
  if (reply->table)
    hoop__rdzv_shared_table_release(reply->table);
  free(reply);
}

void hoop__rdzv_on_written(uv_write_t *req, int status) {
  rdzv_reply *reply = (rdzv_reply *)req; /* req is its first member */
  rdzv_client *client = reply->client;
  hoop__rdzv_server *server = client->server;
  if (status == UV_ETIMEDOUT)
    client->unanswered = 1;
  if (status < 0 && status != UV_ECANCELED && status != UV_ETIMEDOUT)
    HOOP__WARN(HOOP_SUBSYS_RDZV, "reply to %s failed: %s", client->peer, uv_strerror(status));
  int keep_open = reply->keep_open && status == 0;
  hoop__rdzv_reply_free(reply);
  server->pending_writes--;
  if (!keep_open)
    hoop__rdzv_client_close(client);
  hoop__rdzv_check_once_done(server);
}

/* Open the connection with a CHALLENGE: a fresh nonce, and whether requests must prove the token.
 * -1 if it could not be sent (the client is closed then). */
static int send_challenge(rdzv_client *client) {
  hoop__rdzv_server *server = client->server;
  hoop__challenge challenge = {.flags = server->token[0] ? HOOP__CHALLENGE_AUTH : 0};
  rdzv_reply *reply = calloc(1, sizeof *reply);
  if (!reply || hoop__auth_random(challenge.nonce, sizeof challenge.nonce) != 0 ||
      hoop__wire_encode_challenge(&reply->message, &challenge) != 0) {
    HOOP__WARN(HOOP_SUBSYS_RDZV, "cannot greet %s: out of memory or randomness", client->peer);
  } else {
    memcpy(client->challenge, challenge.nonce, sizeof client->challenge);
    reply->client = client;
    reply->keep_open = 1;
    uv_buf_t buf = uv_buf_init((char *)reply->message.data, (unsigned)reply->message.len);
    int rc = uv_write(&reply->req, (uv_stream_t *)&client->tcp, &buf, 1, hoop__rdzv_on_written);
    if (rc == 0) {
      server->pending_writes++;
      return 0;
    }
    HOOP__WARN(HOOP_SUBSYS_RDZV, "cannot greet %s: %s", client->peer, uv_strerror(rc));
  }
  if (reply)
    hoop__rdzv_reply_free(reply);
  hoop__rdzv_client_close(client);
  return -1;
}

/* Send reply (owned from here on) and close the connection once it is written (unless the reply
 * keeps it open: a member's TABLE). Until then the client's timer bounds how long a client that
 * does not read may hold the reply. */
void hoop__rdzv_client_send(rdzv_client *client, rdzv_reply *reply) {
  uv_buf_t bufs[3];
  unsigned nbufs = 1;
  reply->client = client;
  if (reply->table) {
    bufs[0] = uv_buf_init((char *)reply->head, TABLE_HEAD);
    bufs[1] = uv_buf_init((char *)reply->table->wire.data + TABLE_HEAD,
                          (unsigned)(reply->table->wire.len - TABLE_HEAD));
    nbufs = 2;
    if (reply->message.len) /* the TABLE_PROOF that follows a table */
      bufs[nbufs++] = uv_buf_init((char *)reply->message.data, (unsigned)reply->message.len);
  } else {
    bufs[0] = uv_buf_init((char *)reply->message.data, (unsigned)reply->message.len);
  }
  if (!reply->keep_open) {
    client->replying = 1;
    uv_read_stop((uv_stream_t *)&client->tcp);
    uv_timer_start(&client->timer, hoop__rdzv_on_client_timer, client->server->idle_ms, 0);
  }
  int rc = uv_write(&reply->req, (uv_stream_t *)&client->tcp, bufs, nbufs, hoop__rdzv_on_written);
  if (rc != 0) {
    HOOP__WARN(HOOP_SUBSYS_RDZV, "reply to %s: %s", client->peer, uv_strerror(rc));
    hoop__rdzv_reply_free(reply);
    hoop__rdzv_client_close(client);
    return;
  }
  client->server->pending_writes++;
}

/* Reply ERROR {code, message} and close; out of memory, just close. */
void hoop__rdzv_send_error(rdzv_client *client, hoop_result code, const char *fmt, ...) {
  hoop__error_msg error;
  error.code = (uint32_t)code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(error.message, sizeof error.message, fmt, ap);
  va_end(ap);
  rdzv_reply *reply = calloc(1, sizeof *reply);
  if (!reply || hoop__wire_encode_error(&reply->message, &error) != 0) {
    HOOP__WARN(HOOP_SUBSYS_RDZV, "out of memory replying to %s", client->peer);
    if (reply)
      hoop__rdzv_reply_free(reply);
    hoop__rdzv_client_close(client);
    return;
  }
  hoop__rdzv_client_send(client, reply);
}

/* ---- connections ----------------------------------------------------------------------------- */

static void on_client_closed(uv_handle_t *handle) {
  rdzv_client *client = handle->data;
  hoop__rdzv_server *server = client->server;
  if (--client->open_handles == 0) {
    hoop__rdzv_report_free(client);
    free(client);
  }
  hoop__rdzv_handle_closed(server);
}

void hoop__rdzv_client_close(rdzv_client *client) {
  if (client->closing)
    return;
  client->closing = 1;
  hoop__rdzv_server *server = client->server;
  HOOP__TRACE(HOOP_SUBSYS_RDZV, "closing the connection from %s", client->peer);
  hoop__rdzv_dump_forget_requester(client);
  if (client->pending_job)
    hoop__rdzv_newcomer_left(client);
  if (client->job && client->job->running)
    hoop__rdzv_job_member_left(client->job, client);
  else if (client->job)
    hoop__rdzv_job_remove_member(client->job, client);
  if (client->prev)
    client->prev->next = client->next;
  else
    server->clients = client->next;
  if (client->next)
    client->next->prev = client->prev;
  server->nclients--;
  uv_close((uv_handle_t *)&client->tcp, on_client_closed);
  uv_close((uv_handle_t *)&client->timer, on_client_closed);
}

void hoop__rdzv_on_client_timer(uv_timer_t *timer) {
  rdzv_client *client = timer->data;
  char seconds[32];
  hoop__rdzv_format_seconds(client->server->idle_ms, seconds, sizeof seconds);
  if (client->replying)
    HOOP__INFO(HOOP_SUBSYS_RDZV, "closing %s: its reply was not taken within %s s", client->peer,
               seconds);
  else
    HOOP__INFO(HOOP_SUBSYS_RDZV, "closing %s: no complete request within %s s", client->peer,
               seconds);
  client->server->refusals[REFUSED_IDLE]++;
  hoop__rdzv_client_close(client);
}

static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf) {
  rdzv_client *client = handle->data;
  (void)suggested;
  *buf = uv_buf_init((char *)client->in + client->inlen,
                     (unsigned)(sizeof client->in - client->inlen));
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
  rdzv_client *client = stream->data;
  (void)buf;
  if (nread == 0)
    return;
  if (nread < 0) {
    if (nread == UV_ETIMEDOUT)
      client->unanswered = 1;
    /* A member that said goodbye closes with whatever the server sent it last still unread (a
     * STATS answer on its way, say), and its kernel then resets the connection: no news. */
    if (nread == UV_ECONNRESET && client->said_goodbye)
      HOOP__TRACE(HOOP_SUBSYS_RDZV, "%s reset its connection after its goodbye", client->peer);
    else if (nread != UV_EOF && nread != UV_ETIMEDOUT)
      HOOP__WARN(HOOP_SUBSYS_RDZV, "reading from %s: %s", client->peer, uv_strerror((int)nread));
    hoop__rdzv_client_close(client); /* a member leaves its job here */
    return;
  }
  if ((client->job && !client->job->running) || client->pending_job) {
    hoop__rdzv_refuse_malformed(client, "bytes after its HELLO");
    return;
  }
  client->inlen += (size_t)nread;
  if (client->job)
    hoop__rdzv_handle_member_input(client);
  else
    hoop__rdzv_handle_input(client);
}

/* A member's connection is quiet while its job runs, and a host that vanishes (power lost, link
 * down) sends no FIN or RST: probe the connection once it has been idle, so that such a client is
 * dropped after about `seconds` (idle, then KEEPALIVE_PROBES unanswered probes, or as long with
 * a reply unacknowledged) instead of held for ever. */
void hoop__rdzv_keep_alive(rdzv_client *client, int seconds) {
  int one = 1, probes = KEEPALIVE_PROBES;
  int every = seconds / (KEEPALIVE_PROBES + 1) > 0 ? seconds / (KEEPALIVE_PROBES + 1) : 1;
  unsigned user_timeout_ms = (unsigned)seconds * 1000u;
  uv_os_fd_t fd;
  if (uv_fileno((uv_handle_t *)&client->tcp, &fd) != 0)
    return; /* not open: nothing to probe */
  client->keepalive_s = seconds;
  if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &every, sizeof every) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &every, sizeof every) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms) != 0)
    HOOP__WARN(HOOP_SUBSYS_RDZV, "keepalive for %s: %s", client->peer, strerror(errno));
}

/* Set up a client for the connection waiting on the listener; NULL if that failed. */
static rdzv_client *client_accept(hoop__rdzv_server *server) {
  rdzv_client *client = calloc(1, sizeof *client);
  /* Left unaccepted, the connection stays queued and libuv stops watching the listener until a
   * later accept: nothing better is possible without memory. */
  if (!client || uv_tcp_init(server->loop, &client->tcp) != 0) {
    HOOP__ERROR(HOOP_SUBSYS_RDZV, "out of memory accepting a connection on %s", server->where);
    free(client);
    return NULL;
  }
  client->server = server;
  client->tcp.data = client;
  client->timer.data = client;
  client->open_handles = 2;
  server->open_handles += 2;
  uv_timer_init(server->loop, &client->timer); /* cannot fail on Linux: no system call */
  client->next = server->clients;
  if (server->clients)
    server->clients->prev = client;
  server->clients = client;
  server->nclients++;
  int rc = uv_accept((uv_stream_t *)&server->listener, (uv_stream_t *)&client->tcp);
  struct sockaddr_storage addr;
  int addrlen = sizeof addr;
  if (rc == 0)
    rc = uv_tcp_getpeername(&client->tcp, (struct sockaddr *)&addr, &addrlen);
  if (rc != 0) {
    HOOP__WARN(HOOP_SUBSYS_RDZV, "accepting a connection on %s: %s", server->where,
               uv_strerror(rc));
    hoop__rdzv_client_close(client);
    return NULL;
  }
  hoop__format_sockaddr((struct sockaddr *)&addr, client->peer, sizeof client->peer);
  hoop__format_host((struct sockaddr *)&addr, client->from, sizeof client->from);
  client->accepted_ms = uv_now(server->loop);
  hoop__rdzv_keep_alive(client, server->keepalive_s);
  return client;
}

/* A connection that has sent no request yet: no HELLO taken, no reply on its way, no table. */
static int idle(const rdzv_client *client) {
  return !client->closing && !client->replying && client->hello.size == 0 && !client->has_table &&
         !client->pending_job;
}

/* One address may hold max_idle_per_address connections that have sent nothing for
 * IDLE_GRACE_MS, and a share of the server (max_connections / IDLE_SHARE) that have sent nothing
 * whatever their age; at each new connection from it, those past either limit are closed, the
 * oldest first: the list holds the newest first, so the first ones met are kept. Strangers from
 * one place thus cannot fill the server's connections with silence while real ranks wait, neither
 * slowly nor in a burst. A real rank sends its HELLO a round trip after its accept: a burst of
 * them (hundreds of ranks of one host coming at once) stays far below the share. */
static void limit_idle(hoop__rdzv_server *server, const rdzv_client *newest) {
  uint64_t now = uv_now(server->loop);
  int seen = 0, silent = 1; /* the newcomer is silent too */
  /* Never under the limit per address: a server that expects every rank from one address (the
   * embedded one of a large job) sets that to the job's size. */
  int share = server->max_connections / IDLE_SHARE;
  if (share < server->max_idle_per_address)
    share = server->max_idle_per_address;
  for (rdzv_client *c = server->clients, *next; c; c = next) {
    next = c->next;
    if (c == newest || !idle(c) || strcmp(c->from, newest->from) != 0)
      continue;
    int old = now - c->accepted_ms >= IDLE_GRACE_MS;
    if (++silent <= share && (!old || ++seen < server->max_idle_per_address))
      continue;
    if (silent > share)
      HOOP__INFO(HOOP_SUBSYS_RDZV,
                 "closed %s: %s holds %d connections that have sent no request, its share of "
                 "the server's %d; the oldest go",
                 c->peer, c->from, share, server->max_connections);
    else
      HOOP__INFO(HOOP_SUBSYS_RDZV,
                 "closed %s: more than %d connections from %s had sent no request for %d ms (the "
                 "limit per address); the oldest go",
                 c->peer, server->max_idle_per_address - 1, c->from, IDLE_GRACE_MS);
    server->refusals[REFUSED_LIMIT]++;
    hoop__rdzv_client_close(c);
  }
}

/* The server is full: room for newest by closing the oldest silent connection of the address
 * that holds the most of them (newest's own included). 0 when no connection is silent. Counted
 * in a table of the addresses built for the occasion: linear in the connections, which a server
 * under attack pays at each connection past its limit. */
static int make_room(hoop__rdzv_server *server, const rdzv_client *newest) {
  size_t slots = 64;
  while (slots < 2 * (size_t)server->nclients)
    slots *= 2;
  struct place {
    const char *from;
    int silent;
    rdzv_client *oldest;
  } *table = calloc(slots, sizeof *table), *busiest = NULL;
  if (!table)
    return 0;
  for (rdzv_client *c = server->clients; c; c = c->next) {
    if (c == newest || !idle(c))
      continue;
    size_t i = hoop__fnv1a(c->from) & (slots - 1);
    while (table[i].from && strcmp(table[i].from, c->from) != 0)
      i = (i + 1) & (slots - 1);
    table[i].from = c->from;
    table[i].silent++;
    table[i].oldest = c; /* newest first: the last one met is the oldest */
    if (!busiest || table[i].silent > busiest->silent ||
        (table[i].silent == busiest->silent && c->accepted_ms < busiest->oldest->accepted_ms))
      busiest = &table[i];
  }
  rdzv_client *victim = busiest ? busiest->oldest : NULL;
  if (victim) {
    HOOP__INFO(HOOP_SUBSYS_RDZV,
               "closed %s to make room for %s: the server holds %d connections (its limit), %d "
               "of them silent ones from %s, the most of any address",
               victim->peer, newest->peer, server->max_connections, busiest->silent, victim->from);
    hoop__rdzv_client_close(victim);
  }
  free(table);
  return victim != NULL;
}

void hoop__rdzv_on_connection(uv_stream_t *listener, int status) {
  hoop__rdzv_server *server = listener->data;
  if (status < 0) {
    HOOP__WARN(HOOP_SUBSYS_RDZV, "incoming connection on %s: %s", server->where,
               uv_strerror(status));
    return;
  }
  int busy = server->nclients >= server->max_connections;
  rdzv_client *client = client_accept(server);
  if (!client)
    return;
  HOOP__TRACE(HOOP_SUBSYS_RDZV, "connection from %s", client->peer);
  uv_timer_start(&client->timer, hoop__rdzv_on_client_timer, server->idle_ms, 0);
  if (busy && !make_room(server, client)) {
    server->refusals[REFUSED_LIMIT]++;
    HOOP__INFO(HOOP_SUBSYS_RDZV, "refused %s: %d connections open, the limit, none of them silent",
               client->peer, server->max_connections);
    hoop__rdzv_send_error(client, HOOP_ERR_SYSTEM,
                          "the rendezvous server has %d connections open (its limit); "
                          "try again later",
                          server->max_connections);
    return;
  }
  limit_idle(server, client);
  if (send_challenge(client) != 0)
    return;
  int rc = uv_read_start((uv_stream_t *)&client->tcp, on_alloc, on_read);
  if (rc != 0) {
    HOOP__WARN(HOOP_SUBSYS_RDZV, "reading from %s: %s", client->peer, uv_strerror(rc));
    hoop__rdzv_client_close(client);
  }
}
