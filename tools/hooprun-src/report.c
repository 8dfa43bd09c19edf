/* report.c - hooprun's account of the running job's health (hoop(3), "Finding the slow rank"):
 * on SIGUSR1, and every --report seconds, one line on stderr with the job's call rate, the share
 * of time its ranks wait, the ranks the others wait for and the slowest links, from the rendezvous
 * server's view: hooprun's own server, or the hoopd of --rendezvous (asked with the ranks' token).
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "hooprun.h"
#include "rdzv/client.h"
#include "util/netaddr.h"

/* How long a report waits for a hoopd's status reply: it runs on hooprun's loop, whose forwarding
 * of the ranks' output waits meanwhile. */
#define STATUS_WAIT_S 1.0

/* The status of the server that holds the job: 0, or -1 with the reason in err. */
static int job_status(hooprun_job *job, hoop__status *status, char *err, size_t errlen) {
  if (job->server)
    return hoop__rdzv_server_status(job->server, status) == 0
               ? 0
               : (snprintf(err, errlen, "out of memory"), -1);
  if (!job->options.rendezvous) {
    snprintf(err, errlen, "the rendezvous server is gone");
    return -1;
  }
  char host[HOOP__WIRE_MAX_HOST + 1];
  int port;
  struct sockaddr_storage addr;
  socklen_t addrlen;
  if (hoop__split_hostport(job->options.rendezvous, host, sizeof host, &port) != 0 ||
      hoop__resolve(host, port, &addr, &addrlen, err, errlen) != 0)
    return -1;
  return hoop__rendezvous_status((struct sockaddr *)&addr, addrlen, STATUS_WAIT_S, job->token,
                                 status, err, errlen) == HOOP_OK
             ? 0
             : -1;
}

void hooprun_report(hooprun_job *job) {
  hoop__status status;
  char err[512];
  if (job_status(job, &status, err, sizeof err) != 0) {
    hooprun_say(job, "report: %s", err);
    return;
  }
  const hoop__job_status *mine = NULL;
  for (uint32_t i = 0; i < status.njobs; i++)
    if (strcmp(status.jobs[i].job, job->id) == 0)
      mine = &status.jobs[i];
  const hoop__job_health *health = mine ? &mine->health : NULL;
  if (!mine || !health->running) {
    hooprun_say(job, "report: job %s is not running yet", job->id);
  } else if (health->reporting == 0) {
    hooprun_say(job,
                "report: job %s: %u of %u ranks connected; none has reported yet (every "
                "HOOP_STATS_PERIOD s)",
                job->id, mine->joined, mine->size);
  } else {
    hooprun_text late = {0}, links = {0};
    hoop__health_late_text(health, &late);
    if (health->nlinks > 0)
      hoop__health_links_text(health, &links);
    hooprun_say(job,
                "report: job %s: %u of %u ranks connected, %u calls/s, waiting %.1f%% of the "
                "time; late ranks: %s%s%s",
                job->id, mine->joined, mine->size, health->calls_per_s,
                health->wait_permille / 10.0, late.data ? late.data : "",
                links.data ? "; slowest links: " : "", links.data ? links.data : "");
    hooprun_text_free(&late);
    hooprun_text_free(&links);
  }
  hoop__status_free(&status);
}

static void on_sigusr1(uv_signal_t *handle, int signum) {
  (void)signum;
  hooprun_report(handle->data);
}

static void on_report_timer(uv_timer_t *timer) {
  hooprun_report(timer->data);
}

int hooprun_report_start(hooprun_job *job) {
  int err;
  if ((err = uv_signal_init(&job->loop, &job->sigusr1)) != 0 ||
      (err = uv_timer_init(&job->loop, &job->report_timer)) != 0) {
    hooprun_say(job, "cannot set up the reports: %s", hooprun_error_text(err));
    return -1;
  }
  job->sigusr1.data = job->report_timer.data = job;
  if ((err = uv_signal_start(&job->sigusr1, on_sigusr1, SIGUSR1)) != 0) {
    hooprun_say(job, "cannot catch SIGUSR1: %s", hooprun_error_text(err));
    return -1;
  }
  if (job->options.report_s > 0) {
    uint64_t ms = (uint64_t)(job->options.report_s * 1000);
    uv_timer_start(&job->report_timer, on_report_timer, ms, ms);
  }
  return 0;
}

void hooprun_report_stop(hooprun_job *job) {
  uv_signal_stop(&job->sigusr1);
  uv_timer_stop(&job->report_timer);
}
