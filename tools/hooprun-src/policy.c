/* policy.c - the failure policy: the first failure (a rank's, hooprun's, or a signal) stops the
 * job with SIGTERM and SIGKILL after a grace period (after a rank's failure, the others first get
 * a moment to end on their own and say what they saw); the job finishes once every rank has
 * exited and its output is out, or the drain period is over. */
#include "config.h"

#include <signal.h>
#include <stdlib.h>

#include <uv.h>

#include "hooprun.h"
#include "rdzv/server.h"

/* How long ranks get to exit after SIGTERM before they get SIGKILL. */
#define GRACE_MS 3000
/* After a rank's failure, how long the others get to end on their own before SIGTERM: hoop tells
 * them of the failure at once, and each then reports it (naming the rank) and exits. */
#define REPORT_MS 1000
/* A rank's own output is read as soon as it exits; a pipe still open this long after the last
 * rank's exit is held by a process a rank left behind, and hooprun stops reading it (which
 * also ends a writer that keeps going, by EPIPE). */
#define DRAIN_MS 1000

/* ---- stopping and finishing the job -------------------------------------------------------- */

static void signal_ranks(hooprun_job *job, int signum) {
  for (int i = 0; i < job->nslots; i++) {
    hooprun_rank *rank = &job->ranks[i];
    if (!rank->running)
      continue;
    int err = uv_process_kill(&rank->process, signum);
    /* ESRCH: it has just exited, and its exit is on the way. */
    if (err != 0 && err != UV_ESRCH)
      hooprun_say(job, "cannot signal rank %d (pid %d): %s", rank->index, rank->pid,
                  hooprun_error_text(err));
  }
}

static void on_grace_over(uv_timer_t *timer) {
  hooprun_job *job = timer->data;
  hooprun_verbose(job, "%d rank%s still running %d s after SIGTERM; sending SIGKILL", job->running,
                  job->running == 1 ? "" : "s", GRACE_MS / 1000);
  signal_ranks(job, SIGKILL);
}

/* The first cause of a stop sets the job's exit code; 1 when ranks are left to stop. */
static int begin_stop(hooprun_job *job, int exit_code) {
  if (job->stopping)
    return 0;
  job->stopping = 1;
  job->exit_code = exit_code;
  return job->running > 0;
}

/* Stop the job, which then ends with exit_code; only the first cause counts. */
void hooprun_job_stop(hooprun_job *job, int exit_code) {
  if (!begin_stop(job, exit_code))
    return;
  hooprun_verbose(job, "stopping %d running rank%s with SIGTERM", job->running,
                  job->running == 1 ? "" : "s");
  signal_ranks(job, SIGTERM);
  uv_timer_start(&job->grace_timer, on_grace_over, GRACE_MS, 0);
}

static void on_report_over(uv_timer_t *timer) {
  hooprun_job *job = timer->data;
  if (job->running == 0)
    return;
  hooprun_verbose(job, "%d rank%s still running %d s after the failure; stopping with SIGTERM",
                  job->running, job->running == 1 ? "" : "s", REPORT_MS / 1000);
  signal_ranks(job, SIGTERM);
  uv_timer_start(&job->grace_timer, on_grace_over, GRACE_MS, 0);
}

void hooprun_job_stop_after_failure(hooprun_job *job, int exit_code) {
  if (begin_stop(job, exit_code))
    uv_timer_start(&job->grace_timer, on_report_over, REPORT_MS, 0);
}

static void on_linger_over(uv_timer_t *timer) {
  hooprun_job *job = timer->data;
  if (job->stopping || job->running == 0)
    return;
  hooprun_say(job,
              "%d rank%s still running long after the others finished the job (left out of it, "
              "stopped or hung?): stopping %s",
              job->running, job->running == 1 ? "" : "s", job->running == 1 ? "it" : "them");
  hooprun_job_stop(job, job->exit_code);
}

/* --min-np: a rank has finished the job well. Ranks the job went on without (a rank left out of
 * its next generation, perhaps stopped: hooprun never saw it fail) may never end by themselves:
 * they get the job's timeout (HOOP_TIMEOUT, --timeout) and a second, then are stopped, so that
 * hooprun never waits for ever. Ranks of a job that went well end within moments of each other. */
void hooprun_job_finished_by_some(hooprun_job *job) {
  if (job->options.min_np == 0 || job->running == 0 || job->stopping ||
      uv_is_active((uv_handle_t *)&job->linger_timer))
    return;
  double seconds = job->options.timeout ? strtod(job->options.timeout, NULL) : 300.0;
  uv_timer_start(&job->linger_timer, on_linger_over, (uint64_t)(seconds * 1000) + 1000, 0);
}

static void on_drain_over(uv_timer_t *timer) {
  hooprun_job *job = timer->data;
  for (int i = 0; i < job->nslots; i++) {
    hooprun_output *outputs[2] = {&job->ranks[i].out, &job->ranks[i].err};
    for (int k = 0; k < 2; k++) {
      if (!outputs[k]->open)
        continue;
      hooprun_verbose(job,
                      "rank %d's %s is still open %d s after the last exit (held by a process it "
                      "started?); closing it",
                      i, outputs[k]->name, DRAIN_MS / 1000);
      hooprun_output_close(job, outputs[k]);
    }
  }
}

/* Every rank has exited and its output is out: stop what keeps the loop running, so that
 * uv_run returns and main closes what is left. */
void hooprun_job_finish(hooprun_job *job) {
  job->finished = 1;
  uv_timer_stop(&job->grace_timer);
  uv_timer_stop(&job->drain_timer);
  uv_timer_stop(&job->linger_timer);
  uv_signal_stop(&job->sigint);
  uv_signal_stop(&job->sigterm);
  hooprun_report_stop(job);
  if (job->server) {
    hoop__rdzv_server_close(job->server);
    job->server = NULL;
  }
}

/* Called after anything that may end the job: a rank's exit, the end of an output. */
void hooprun_job_progress(hooprun_job *job) {
  if (job->finished || job->running > 0)
    return;
  uv_timer_stop(&job->grace_timer);
  if (job->outputs_open == 0) {
    hooprun_job_finish(job);
  } else if (!uv_is_active((uv_handle_t *)&job->drain_timer)) {
    /* From now, not from when this loop iteration began: forwarding output can take long. */
    uv_update_time(&job->loop);
    uv_timer_start(&job->drain_timer, on_drain_over, DRAIN_MS, 0);
  }
}

/* The ranks are in hooprun's process group, so a Ctrl-C at a terminal reaches them directly;
 * this also covers a signal sent to hooprun alone (kill, a batch system). */
void hooprun_on_signal(uv_signal_t *handle, int signum) {
  hooprun_job *job = handle->data;
  const char *name = signum == SIGINT ? "SIGINT" : "SIGTERM";
  if (job->stopping) {
    hooprun_say(job, "got %s while stopping the job; killing the ranks now", name);
    signal_ranks(job, SIGKILL);
    return;
  }
  hooprun_say(job, "got %s; stopping the job", name);
  hooprun_job_stop(job, 128 + signum);
}
