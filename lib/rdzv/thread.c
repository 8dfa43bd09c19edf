/* thread.c - a rendezvous server on a thread and libuv loop of its own, for a rank that hosts its
 * job's rendezvous (HOOP_RDZV_SERVE=1). */
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

/* ---- a server on its own thread -------------------------------------------------------------- */

struct hoop__rdzv_thread {
  uv_loop_t loop;
  uv_async_t stop; /* the one thread-safe way into the loop: asks it to close the server */
  pthread_t thread;
  hoop__rdzv_server *server;
  int port;
};

static void on_stop(uv_async_t *async) {
  hoop__rdzv_thread *thread = async->data;
  hoop__rdzv_server_close(thread->server);
  uv_close((uv_handle_t *)async, NULL);
}

static void *serve(void *arg) {
  hoop__rdzv_thread *thread = arg;
  uv_run(&thread->loop, UV_RUN_DEFAULT);
  return NULL;
}

/* Undo a start that failed after the loop was set up: let the loop close what is open. */
static void thread_abandon(hoop__rdzv_thread *thread, int async_open) {
  hoop__rdzv_server_close(thread->server);
  if (async_open)
    uv_close((uv_handle_t *)&thread->stop, NULL);
  uv_run(&thread->loop, UV_RUN_DEFAULT);
  int rc = uv_loop_close(&thread->loop);
  if (rc != 0)
    HOOP__WARN(HOOP_SUBSYS_RDZV, "uv_loop_close: %s", uv_strerror(rc));
  free(thread);
}

/* Start the thread with every signal blocked: the process's signals stay with its own threads, and
 * a client that hangs up mid-reply makes the write fail with EPIPE instead of raising SIGPIPE. */
static int spawn_blocked(hoop__rdzv_thread *thread) {
  sigset_t all, old;
  sigfillset(&all);
  int rc = pthread_sigmask(SIG_SETMASK, &all, &old);
  if (rc != 0)
    return rc;
  rc = pthread_create(&thread->thread, NULL, serve, thread);
  int restored = pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (restored != 0)
    HOOP__WARN(HOOP_SUBSYS_RDZV, "restoring the signal mask: %s", strerror(restored));
  return rc;
}

int hoop__rdzv_thread_start(const hoop__rdzv_options *options, hoop__rdzv_thread **out, char *err,
                            size_t errlen) {
  *out = NULL;
  hoop__rdzv_thread *thread = calloc(1, sizeof *thread);
  if (!thread) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  int rc = uv_loop_init(&thread->loop);
  if (rc != 0) {
    snprintf(err, errlen, "uv_loop_init: %s", uv_strerror(rc));
    free(thread);
    return -1;
  }
  /* The server starts on this thread, so the port is known when we return; the loop is handed to
   * the new thread after that and not touched here again. */
  if (hoop__rdzv_server_start(&thread->loop, options, &thread->server, err, errlen) != 0) {
    thread_abandon(thread, 0);
    return -1;
  }
  thread->port = hoop__rdzv_server_port(thread->server);
  if ((rc = uv_async_init(&thread->loop, &thread->stop, on_stop)) != 0) {
    snprintf(err, errlen, "uv_async_init: %s", uv_strerror(rc));
    thread_abandon(thread, 0);
    return -1;
  }
  thread->stop.data = thread;
  if ((rc = spawn_blocked(thread)) != 0) {
    snprintf(err, errlen, "pthread_create: %s", strerror(rc));
    thread_abandon(thread, 1);
    return -1;
  }
  *out = thread;
  return 0;
}

int hoop__rdzv_thread_port(const hoop__rdzv_thread *thread) {
  return thread->port;
}

void hoop__rdzv_thread_stop(hoop__rdzv_thread *thread) {
  if (!thread)
    return;
  int rc = uv_async_send(&thread->stop);
  if (rc != 0)
    HOOP__ERROR(HOOP_SUBSYS_RDZV, "uv_async_send: %s", uv_strerror(rc));
  rc = pthread_join(thread->thread, NULL);
  if (rc != 0)
    HOOP__ERROR(HOOP_SUBSYS_RDZV, "pthread_join: %s", strerror(rc));
  rc = uv_loop_close(&thread->loop);
  if (rc != 0)
    HOOP__WARN(HOOP_SUBSYS_RDZV, "uv_loop_close: %s", uv_strerror(rc));
  free(thread);
}
