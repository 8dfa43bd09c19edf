/* watch.c - the launcher watch (see watch.h). */
#include "comm/state.h"
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "comm/watch.h"
#include "core/env.h"
#include "core/log.h"
#include "rdzv/client.h"
#include "util/clock.h"

/* How long the launcher's pidfd may lag behind its rendezvous connection's closing. */
#define LEFT_OUT_WAIT_MS 2000
/* How long the rank has after its SIGTERM before it sends itself SIGKILL. */
#define TERM_GRACE_S 3

struct hoop__watch {
  pthread_t thread;
  int pidfd;   /* the launcher's process, or -1 */
  int rdzv_fd; /* a duplicate of the rendezvous connection to the launcher's server, or -1 */
  int stop[2]; /* a pipe: hoop__launcher_watch_stop writes to it */
  long pid;    /* the launcher's pid, for the message */
};

/* The start time (clock ticks after boot, field 22 of /proc/PID/stat) of pid; 0 if it is gone. */
static uint64_t start_time(long pid) {
  char path[64], line[1024];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE *file = fopen(path, "re");
  if (!file)
    return 0;
  size_t n = fread(line, 1, sizeof line - 1, file);
  fclose(file);
  line[n] = '\0';
  /* The command name (field 2) may hold spaces and parentheses: fields resume after the last ')'.
   */
  char *at = strrchr(line, ')');
  if (!at)
    return 0;
  unsigned long long value = 0;
  /* After ')': state (3), then fields 4..21, then starttime (22). */
  if (sscanf(at + 1,
             " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
             &value) != 1)
    return 0;
  return value;
}

void hoop__launcher_identity(char *out, size_t outlen) {
  char boot[64];
  hoop__boot_id(boot, sizeof boot);
  long pid = (long)getpid();
  snprintf(out, outlen, "%ld:%" PRIu64 ":%s", pid, start_time(pid), boot);
}

static void launcher_gone(hoop_comm *comm, long pid, const char *how) {
  char reason[160];
  snprintf(reason, sizeof reason, "its launcher hooprun (pid %ld) is gone (%s)", pid, how);
  HOOP__WARN(HOOP_SUBSYS_INIT, "%s: ending this rank", reason);
  hoop_abort(comm, reason);
  kill(getpid(), SIGTERM);
  struct timespec grace = {TERM_GRACE_S, 0};
  nanosleep(&grace, NULL);
  HOOP__WARN(HOOP_SUBSYS_INIT, "still running %d s after SIGTERM: SIGKILL", TERM_GRACE_S);
  kill(getpid(), SIGKILL);
}

static void *watch_main(void *arg) {
  hoop_comm *comm = arg;
  struct hoop__watch *w = comm->life->watch;
  struct pollfd fds[3] = {
      {w->stop[0], POLLIN, 0}, {w->pidfd, POLLIN, 0}, {w->rdzv_fd, POLLRDHUP, 0}};
  for (;;) {
    if (poll(fds, 3, -1) < 0) {
      if (errno == EINTR)
        continue;
      return NULL;
    }
    if (fds[0].revents)
      return NULL; /* finalize */
    if (fds[1].revents) {
      launcher_gone(comm, w->pid, "its process exited");
      return NULL;
    }
    if (fds[2].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
      /* On the launcher's machine its process tells whether it is gone: a server that closes
       * the connection of a live hooprun has left this rank out of the job (an elastic job's
       * next generation), which the rank's own calls report; the program decides then. A dying
       * process closes its sockets before its pidfd fires, so the pidfd gets a moment. */
      if (w->pidfd >= 0 && poll(&fds[1], 1, LEFT_OUT_WAIT_MS) == 0) {
        HOOP__WARN(HOOP_SUBSYS_INIT,
                   "the rendezvous server closed this rank's connection while hooprun (pid %ld) "
                   "runs on: this rank is out of the job (left out of its next generation?)",
                   w->pid);
        return NULL;
      }
      launcher_gone(comm, w->pid, "its rendezvous server closed the connection");
      return NULL;
    }
  }
}

void hoop__launcher_watch_start(hoop_comm *comm) {
  const char *spec = hoop__env_get("HOOP_LAUNCHER");
  if (!spec[0] || comm->life->watch)
    return;
  long pid = 0;
  unsigned long long started = 0;
  char boot[64] = "", mine[64];
  if (sscanf(spec, "%ld:%llu:%63s", &pid, &started, boot) != 3 || pid <= 0) {
    HOOP__WARN(HOOP_SUBSYS_INIT, "HOOP_LAUNCHER '%s' is not PID:START:BOOT_ID; not watching it",
               spec);
    return;
  }
  struct hoop__watch *w = calloc(1, sizeof *w);
  if (!w)
    return;
  w->pid = pid;
  w->pidfd = w->rdzv_fd = -1;
  hoop__boot_id(mine, sizeof mine);
  int gone = 0;
  if (mine[0] && strcmp(mine, boot) == 0) {
    /* The launcher's machine: its process, if it is still the one that started this rank. */
#ifdef SYS_pidfd_open
    w->pidfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
#endif
    if (start_time(pid) != started)
      gone = 1;
  }
  if (strcmp(hoop__env_get("HOOP_LAUNCHER_RDZV"), "1") == 0 && hoop__rendezvous_fd(comm) >= 0)
    w->rdzv_fd = fcntl(hoop__rendezvous_fd(comm), F_DUPFD_CLOEXEC, 0);
  if (pipe2(w->stop, O_CLOEXEC) != 0 || (w->pidfd < 0 && w->rdzv_fd < 0 && !gone)) {
    if (w->pidfd >= 0)
      close(w->pidfd);
    if (w->rdzv_fd >= 0)
      close(w->rdzv_fd);
    free(w);
    return;
  }
  comm->life->watch = w;
  if (gone) {
    launcher_gone(comm, pid, "it exited before this rank started watching");
    return;
  }
  if (pthread_create(&w->thread, NULL, watch_main, comm) != 0) {
    HOOP__WARN(HOOP_SUBSYS_INIT, "cannot start the launcher watch: %s", strerror(errno));
    hoop__launcher_watch_stop(comm);
    return;
  }
  HOOP__TRACE(HOOP_SUBSYS_INIT, "watching the launcher (pid %ld%s%s)", pid,
              w->pidfd >= 0 ? ", its process" : "",
              w->rdzv_fd >= 0 ? ", its rendezvous connection" : "");
  comm->life->watch_running = 1;
}

void hoop__launcher_watch_stop(hoop_comm *comm) {
  struct hoop__watch *w = comm->life->watch;
  if (!w)
    return;
  if (comm->life->watch_running) {
    char byte = 1;
    if (write(w->stop[1], &byte, 1) < 0)
      HOOP__TRACE(HOOP_SUBSYS_INIT, "stopping the launcher watch: %s", strerror(errno));
    pthread_join(w->thread, NULL);
  }
  close(w->stop[0]);
  close(w->stop[1]);
  if (w->pidfd >= 0)
    close(w->pidfd);
  if (w->rdzv_fd >= 0)
    close(w->rdzv_fd);
  free(w);
  comm->life->watch = NULL;
  comm->life->watch_running = 0;
}
