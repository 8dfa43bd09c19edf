/* hoopd_metrics.c - hoopd --metrics: the rendezvous server's metrics over HTTP for Prometheus
 * (GET /metrics; lib/rdzv/metrics.c writes them). On a loopback address anyone on the host may
 * read them; on any other, only a request that carries the metrics token (--metrics-token-file) as
 * a bearer token, which Prometheus sends with `authorization: {credentials_file: ...}`. One request
 * per connection, bounded in size, time and number of connections; the daemon's loop serves it. */
#include "hoopd_metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "core/log.h"
#include "proto/auth.h"
#include "util/buf.h"
#include "util/netaddr.h"

#define REQUEST_MAX 8192     /* bytes of a request's line and headers */
#define REQUEST_WAIT_MS 5000 /* for the whole request, and for the reply to be taken */
#define CONNECTIONS_MAX 32   /* at once; more are closed at their accept */
#define BEARER_MAX 256

struct hoopd_metrics {
  uv_tcp_t listener;
  hoop__rdzv_server *server;
  char bearer[BEARER_MAX + 1]; /* "": none asked */
  char where[80];
  struct metrics_conn *conns; /* open, newest first */
  int connections;
  int closing, listener_open;
};

typedef struct metrics_conn {
  uv_tcp_t tcp;
  uv_timer_t timer;
  uv_write_t write;
  hoopd_metrics *metrics;
  struct metrics_conn *prev, *next;
  hoop__buf reply;
  int handles; /* of tcp and timer still open */
  int replying;
  size_t len;
  char in[REQUEST_MAX];
} metrics_conn;

static void metrics_free(hoopd_metrics *metrics) {
  hoop__auth_wipe(metrics->bearer, sizeof metrics->bearer);
  free(metrics);
}

static void conn_closed(uv_handle_t *handle) {
  metrics_conn *conn = handle->data;
  if (--conn->handles > 0)
    return;
  hoopd_metrics *metrics = conn->metrics;
  if (conn->prev)
    conn->prev->next = conn->next;
  else
    metrics->conns = conn->next;
  if (conn->next)
    conn->next->prev = conn->prev;
  metrics->connections--;
  hoop__buf_free(&conn->reply);
  free(conn);
  if (metrics->closing && !metrics->listener_open && metrics->connections == 0)
    metrics_free(metrics);
}

static void conn_close(metrics_conn *conn) {
  if (uv_is_closing((uv_handle_t *)&conn->tcp))
    return;
  uv_close((uv_handle_t *)&conn->tcp, conn_closed);
  uv_close((uv_handle_t *)&conn->timer, conn_closed);
}

static void on_written(uv_write_t *req, int status) {
  (void)status;
  conn_close(req->data);
}

static void reply(metrics_conn *conn, const char *status, const char *extra_headers,
                  const char *body, size_t body_len) {
  conn->replying = 1;
  uv_read_stop((uv_stream_t *)&conn->tcp);
  hoop__buf head = {0};
  hoop__buf_printf(&head,
                   "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: "
                   "close\r\n\r\n",
                   status,
                   strncmp(status, "200", 3) == 0 ? "text/plain; version=0.0.4; charset=utf-8"
                                                  : "text/plain; charset=utf-8",
                   body_len, extra_headers ? extra_headers : "");
  hoop__buf_append(&head, body, body_len);
  if (head.failed) {
    hoop__buf_free(&head);
    conn_close(conn);
    return;
  }
  conn->reply = head;
  uv_buf_t buf = uv_buf_init(conn->reply.data, (unsigned)conn->reply.len);
  conn->write.data = conn;
  if (uv_write(&conn->write, (uv_stream_t *)&conn->tcp, &buf, 1, on_written) != 0)
    conn_close(conn);
}

static void reply_text(metrics_conn *conn, const char *status, const char *extra_headers,
                       const char *text) {
  reply(conn, status, extra_headers, text, strlen(text));
}

/* The value of header name (case-insensitive) in the request's headers, copied into out; 0, or -1
 * when it is absent or longer than out holds. */
static int header_value(const char *headers, const char *name, char *out, size_t cap) {
  size_t nlen = strlen(name);
  for (const char *line = headers; line && *line; line = strstr(line, "\r\n")) {
    if (line[0] == '\r')
      line += 2;
    if (strncasecmp(line, name, nlen) == 0 && line[nlen] == ':') {
      const char *v = line + nlen + 1;
      while (*v == ' ' || *v == '\t')
        v++;
      const char *end = strstr(v, "\r\n");
      size_t len = end ? (size_t)(end - v) : strlen(v);
      while (len > 0 && (v[len - 1] == ' ' || v[len - 1] == '\t'))
        len--;
      if (len >= cap)
        return -1;
      memcpy(out, v, len);
      out[len] = '\0';
      return 0;
    }
  }
  return -1;
}

static int authorized(const hoopd_metrics *metrics, const char *headers) {
  if (!metrics->bearer[0])
    return 1;
  char value[BEARER_MAX + 16];
  if (header_value(headers, "Authorization", value, sizeof value) != 0 ||
      strncasecmp(value, "Bearer ", 7) != 0)
    return 0;
  const char *given = value + 7;
  size_t len = strlen(metrics->bearer);
  return strlen(given) == len &&
         hoop__auth_equal((const uint8_t *)given, (const uint8_t *)metrics->bearer, len);
}

/* The request is whole (its headers end at a blank line): answer it. */
static void serve(metrics_conn *conn) {
  char *line_end = strstr(conn->in, "\r\n");
  *line_end = '\0';
  const char *headers = line_end + 2;
  char method[16], path[256], version[16];
  if (sscanf(conn->in, "%15s %255s %15s", method, path, version) != 3 ||
      strncmp(version, "HTTP/1.", 7) != 0) {
    reply_text(conn, "400 Bad Request", NULL, "not an HTTP/1 request\n");
    return;
  }
  if (strcmp(method, "GET") != 0) {
    reply_text(conn, "405 Method Not Allowed", "Allow: GET\r\n", "GET /metrics only\n");
    return;
  }
  if (strcmp(path, "/metrics") != 0 && strncmp(path, "/metrics?", 9) != 0) {
    reply_text(conn, "404 Not Found", NULL, "hoopd serves /metrics only\n");
    return;
  }
  if (!authorized(conn->metrics, headers)) {
    HOOP__INFO(HOOP_SUBSYS_RDZV, "metrics: refused a request without the metrics token");
    reply_text(conn, "401 Unauthorized", "WWW-Authenticate: Bearer\r\n",
               "the metrics token is needed (Authorization: Bearer ...)\n");
    return;
  }
  hoop__buf body = {0};
  hoop__rdzv_metrics_text(conn->metrics->server, &body);
  if (body.failed) {
    hoop__buf_free(&body);
    reply_text(conn, "503 Service Unavailable", NULL, "out of memory\n");
    return;
  }
  reply(conn, "200 OK", NULL, body.data ? body.data : "", body.len);
  hoop__buf_free(&body);
}

static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf) {
  metrics_conn *conn = handle->data;
  (void)suggested;
  /* One byte kept for the terminating NUL. */
  *buf = uv_buf_init(conn->in + conn->len, (unsigned)(sizeof conn->in - 1 - conn->len));
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
  metrics_conn *conn = stream->data;
  (void)buf;
  if (nread < 0) {
    conn_close(conn);
    return;
  }
  if (conn->replying)
    return;
  conn->len += (size_t)nread;
  conn->in[conn->len] = '\0';
  if (memchr(conn->in, '\0', conn->len)) {
    reply_text(conn, "400 Bad Request", NULL, "a NUL in the request\n");
  } else if (strstr(conn->in, "\r\n\r\n")) {
    serve(conn);
  } else if (conn->len >= sizeof conn->in - 1) {
    reply_text(conn, "431 Request Header Fields Too Large", NULL, "request too large\n");
  }
}

static void on_timer(uv_timer_t *timer) {
  conn_close(timer->data);
}

static void on_connection(uv_stream_t *listener, int status) {
  hoopd_metrics *metrics = listener->data;
  if (status < 0)
    return;
  metrics_conn *conn = calloc(1, sizeof *conn);
  if (!conn)
    return; /* left queued: libuv tries again */
  conn->metrics = metrics;
  uv_tcp_init(listener->loop, &conn->tcp);
  uv_timer_init(listener->loop, &conn->timer);
  conn->tcp.data = conn->timer.data = conn;
  conn->handles = 2;
  conn->next = metrics->conns;
  if (metrics->conns)
    metrics->conns->prev = conn;
  metrics->conns = conn;
  metrics->connections++;
  if (uv_accept(listener, (uv_stream_t *)&conn->tcp) != 0 ||
      metrics->connections > CONNECTIONS_MAX) {
    conn_close(conn);
    return;
  }
  uv_timer_start(&conn->timer, on_timer, REQUEST_WAIT_MS, 0);
  if (uv_read_start((uv_stream_t *)&conn->tcp, on_alloc, on_read) != 0)
    conn_close(conn);
}

static int loopback(const struct sockaddr_storage *addr) {
  if (addr->ss_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)addr)->sin_addr.s_addr) >> 24) == 127;
  if (addr->ss_family == AF_INET6) {
    const struct in6_addr *a = &((const struct sockaddr_in6 *)addr)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
  }
  return 0;
}

int hoopd_metrics_start(uv_loop_t *loop, hoop__rdzv_server *server, const char *listen,
                        const char *bearer, hoopd_metrics **out, char *err, size_t errlen) {
  char host[256];
  int port;
  struct sockaddr_storage addr;
  socklen_t addrlen;
  *out = NULL;
  if (hoop__split_hostport(listen, host, sizeof host, &port) != 0) {
    snprintf(err, errlen, "--metrics '%s' is not host:port or [v6]:port", listen);
    return -1;
  }
  if (hoop__resolve(host[0] ? host : "127.0.0.1", port, &addr, &addrlen, err, errlen) != 0)
    return -1;
  if (!loopback(&addr) && !(bearer && bearer[0])) {
    snprintf(err, errlen,
             "--metrics %s is not a loopback address: give --metrics-token-file, whose token "
             "scrapers must send (Authorization: Bearer), or listen on 127.0.0.1",
             listen);
    return -1;
  }
  if (bearer && strlen(bearer) > BEARER_MAX) {
    snprintf(err, errlen, "the metrics token is longer than %d bytes", BEARER_MAX);
    return -1;
  }
  hoopd_metrics *metrics = calloc(1, sizeof *metrics);
  if (!metrics) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  metrics->server = server;
  snprintf(metrics->bearer, sizeof metrics->bearer, "%s", bearer ? bearer : "");
  uv_tcp_init(loop, &metrics->listener);
  metrics->listener.data = metrics;
  metrics->listener_open = 1;
  int rc = uv_tcp_bind(&metrics->listener, (const struct sockaddr *)&addr, 0);
  if (rc == 0)
    rc = uv_listen((uv_stream_t *)&metrics->listener, 64, on_connection);
  int namelen = (int)sizeof addr;
  if (rc == 0)
    rc = uv_tcp_getsockname(&metrics->listener, (struct sockaddr *)&addr, &namelen);
  if (rc != 0) {
    snprintf(err, errlen, "--metrics %s: %s", listen, uv_strerror(rc));
    hoopd_metrics_close(metrics);
    return -1;
  }
  hoop__format_sockaddr((const struct sockaddr *)&addr, metrics->where, sizeof metrics->where);
  HOOP__INFO(HOOP_SUBSYS_RDZV, "metrics on http://%s/metrics%s", metrics->where,
             metrics->bearer[0] ? " (the metrics token needed)" : "");
  *out = metrics;
  return 0;
}

static void listener_closed(uv_handle_t *handle) {
  hoopd_metrics *metrics = handle->data;
  metrics->listener_open = 0;
  if (metrics->connections == 0)
    metrics_free(metrics);
}

void hoopd_metrics_close(hoopd_metrics *metrics) {
  if (!metrics || metrics->closing)
    return;
  metrics->closing = 1;
  for (metrics_conn *conn = metrics->conns; conn; conn = conn->next)
    conn_close(conn);
  uv_close((uv_handle_t *)&metrics->listener, listener_closed);
}
