/* server.c - the rendezvous server on libuv (see server.h): its listener, start and close; the
 * other files are named in server_impl.h. The server opens each
 * connection with a CHALLENGE; the connection then carries one request: a HELLO, answered by the
 * job's TABLE or an ERROR once the job completes or fails, or a STATUS_REQ, answered at once. With
 * a token, a request without the right proof is refused with HOOP_ERR_AUTH and changes nothing.
 *
 * A STATUS_REQ's or a failed HELLO's connection is closed after the reply. A member that got its
 * TABLE keeps its connection while its communicator lives: the job stays here, running (no longer
 * waiting, so its id is free for a new job), until every member has left. A member may send ABORT
 * (for its own rank only), relayed to the others as a NOTICE, and says BYE when it finalizes; one
 * whose connection closes without a BYE (or an ABORT) died, and the others are told it was lost.
 * Anything else from a member closes its connection. */
#include <errno.h>
#include <limits.h>
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
#include "util/netaddr.h"

void hoop__rdzv_server_free(hoop__rdzv_server *server) {
  hoop__auth_wipe(server->token, sizeof server->token);
  free(server);
}

/* ---- the server ------------------------------------------------------------------------------ */

static void on_listener_closed(uv_handle_t *handle) {
  hoop__rdzv_handle_closed(handle->data);
}

static void stop_listening(hoop__rdzv_server *server) {
  if (!server->listening)
    return;
  server->listening = 0;
  uv_close((uv_handle_t *)&server->listener, on_listener_closed);
}

/* With `once`: the job is over; stop listening, drop whoever else is connected, and tell the owner
 * once the last reply has been written. An elastic server listens on until its owner closes it: a
 * replacement that starts as the job ends is told at once that it came late (shrink.c) instead of
 * finding nobody to connect to until its timeout. */
void hoop__rdzv_check_once_done(hoop__rdzv_server *server) {
  if (!server->once_over || server->done_called || server->closing)
    return;
  if (server->listening && !server->elastic) {
    HOOP__INFO(HOOP_SUBSYS_RDZV, "served its one job; no longer listening on %s", server->where);
    stop_listening(server);
    for (rdzv_client *client = server->clients, *next; client; client = next) {
      next = client->next;
      if (!client->replying && !client->job)
        hoop__rdzv_client_close(client);
    }
  }
  if (server->pending_writes > 0 || server->nrunning > 0)
    return;
  server->done_called = 1;
  if (server->on_done)
    server->on_done(server->arg);
}

/* A bound, listening socket for addr; -1 with a message in err. libuv takes it over afterwards;
 * binding it here keeps a failed start from leaving a handle in the loop. */
static int listen_socket(const struct sockaddr_storage *addr, socklen_t addrlen, char *err,
                         size_t errlen) {
  char where[80];
  hoop__format_sockaddr((const struct sockaddr *)addr, where, sizeof where);
  int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(err, errlen, "socket for %s: %s", where, strerror(errno));
    return -1;
  }
  int on = 1, off = 0;
  const char *failed = NULL;
  /* SO_REUSEADDR: a restarted daemon binds again while old connections linger in TIME_WAIT.
   * IPV6_V6ONLY off: "[::]" takes IPv4 clients too. */
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0)
    failed = "setsockopt(SO_REUSEADDR)";
  else if (addr->ss_family == AF_INET6 &&
           setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off) != 0)
    failed = "setsockopt(IPV6_V6ONLY)";
  else if (bind(fd, (const struct sockaddr *)addr, addrlen) != 0)
    failed = "bind";
  else if (listen(fd, LISTEN_BACKLOG) != 0)
    failed = "listen";
  if (failed) {
    snprintf(err, errlen, "cannot listen on %s: %s: %s", where, failed, strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

static void set_options(hoop__rdzv_server *server, const hoop__rdzv_options *options) {
  server->max_jobs = options->max_jobs > 0 ? options->max_jobs : DEFAULT_MAX_JOBS;
  server->max_connections =
      options->max_connections > 0 ? options->max_connections : HOOP__RDZV_MAX_CONNECTIONS;
  server->max_idle_per_address =
      options->max_idle_per_address > 0 ? options->max_idle_per_address : DEFAULT_IDLE_PER_ADDRESS;
  double idle_s = options->idle_timeout_s > 0 ? options->idle_timeout_s : DEFAULT_IDLE_TIMEOUT_S;
  server->idle_ms = idle_s > 1e9 ? (uint64_t)1e12 : (uint64_t)(idle_s * 1000);
  server->keepalive_s = options->keepalive_s > 0 ? options->keepalive_s : DEFAULT_KEEPALIVE_S;
  server->once = options->once;
  server->require_sealed = options->require_sealed;
  server->elastic = options->elastic;
  if (options->once && options->only_job) {
    snprintf(server->only_job, sizeof server->only_job, "%s", options->only_job);
    server->only_size = options->only_size;
    server->only_timeout_ms = options->only_timeout_ms;
  }
  snprintf(server->token, sizeof server->token, "%s", options->token ? options->token : "");
  server->on_done = options->on_done;
  server->arg = options->arg;
}

/* Hand fd to libuv and start accepting. On failure the server is freed: at once, or (when libuv
 * already holds the handle) by the loop when it next runs. */
static int start_listening(hoop__rdzv_server *server, int fd, char *err, size_t errlen) {
  int rc = uv_tcp_init(server->loop, &server->listener);
  if (rc != 0) {
    snprintf(err, errlen, "uv_tcp_init: %s", uv_strerror(rc));
    close(fd);
    hoop__rdzv_server_free(server);
    return -1;
  }
  server->listener.data = server;
  server->open_handles = 1;
  server->listening = 1;
  const char *failed = NULL;
  rc = uv_tcp_open(&server->listener, fd);
  if (rc != 0) {
    failed = "uv_tcp_open";
    close(fd); /* not the handle's yet */
  } else if ((rc = uv_listen((uv_stream_t *)&server->listener, LISTEN_BACKLOG,
                             hoop__rdzv_on_connection))) {
    failed = "uv_listen";
  }
  if (!failed)
    return 0;
  snprintf(err, errlen, "%s on %s: %s", failed, server->where, uv_strerror(rc));
  server->closing = 1;
  stop_listening(server);
  return -1;
}

int hoop__rdzv_server_start(uv_loop_t *loop, const hoop__rdzv_options *options,
                            hoop__rdzv_server **out, char *err, size_t errlen) {
  char host[HOOP__WIRE_MAX_HOST + 1];
  int port;
  struct sockaddr_storage addr;
  socklen_t addrlen;
  *out = NULL;
  if (!options->listen || hoop__split_hostport(options->listen, host, sizeof host, &port) != 0) {
    snprintf(err, errlen, "listen address '%s' is not host:port, [v6]:port or :port",
             options->listen ? options->listen : "(null)");
    return -1;
  }
  if (hoop__resolve(host[0] ? host : "0.0.0.0", port, &addr, &addrlen, err, errlen) != 0)
    return -1;
  int fd = listen_socket(&addr, addrlen, err, errlen);
  if (fd < 0)
    return -1;
  addrlen = sizeof addr;
  hoop__rdzv_server *server = calloc(1, sizeof *server);
  if (!server || getsockname(fd, (struct sockaddr *)&addr, &addrlen) != 0) {
    snprintf(err, errlen, "%s%s", server ? "getsockname: " : "out of memory",
             server ? strerror(errno) : "");
    hoop__rdzv_server_free(server);
    close(fd);
    return -1;
  }
  server->loop = loop;
  server->port = ntohs(addr.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&addr)->sin6_port
                                                  : ((struct sockaddr_in *)&addr)->sin_port);
  hoop__format_sockaddr((struct sockaddr *)&addr, server->where, sizeof server->where);
  set_options(server, options);
  if (start_listening(server, fd, err, errlen) != 0)
    return -1;
  HOOP__INFO(HOOP_SUBSYS_RDZV, "listening on %s", server->where);
  *out = server;
  return 0;
}

long hoop__raise_open_files(long want, long *hard) {
  struct rlimit lim;
  *hard = want;
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0)
    return want; /* cannot tell: let accept() say */
  const rlim_t wanted = (rlim_t)want;
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < wanted) {
    rlim_t raised = lim.rlim_max != RLIM_INFINITY && lim.rlim_max < wanted ? lim.rlim_max : wanted;
    struct rlimit next = {raised, lim.rlim_max};
    if (raised > lim.rlim_cur && setrlimit(RLIMIT_NOFILE, &next) == 0)
      lim.rlim_cur = raised;
  }
  if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= wanted)
    return want;
  /* Short of want: the hard limit as it is, even where it was high enough but raising failed. */
  *hard = lim.rlim_max == RLIM_INFINITY || lim.rlim_max > (rlim_t)LONG_MAX ? LONG_MAX
                                                                           : (long)lim.rlim_max;
  return (long)lim.rlim_cur;
}

int hoop__rdzv_server_port(const hoop__rdzv_server *server) {
  return server->port;
}

void hoop__rdzv_server_close(hoop__rdzv_server *server) {
  if (!server || server->closing)
    return;
  server->closing = 1;
  stop_listening(server);
  while (server->clients)
    hoop__rdzv_client_close(
        server->clients); /* members leave their jobs, and empty jobs are forgotten */
  while (server->jobs)
    hoop__rdzv_job_forget(server->jobs);
  if (server->open_handles == 0)
    hoop__rdzv_server_free(server);
}
