/* spawn.c - starting the ranks, on this host or through the remote shell (a remote rank gets the
 * token on its stdin), and reporting the ranks that exit. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "hooprun.h"
#include "proto/auth.h"

/* A rank's slot, empty: its index, host, tag and outputs (main.c fills the first ones; a
 * replacement takes a failed rank's). */
void hooprun_init_rank(hooprun_job *job, int index, const hooprun_host *host) {
  hooprun_rank *rank = &job->ranks[index];
  memset(rank, 0, sizeof *rank);
  rank->job = job;
  rank->index = index;
  rank->host = host;
  if (job->options.tag_output)
    snprintf(rank->tag, sizeof rank->tag, "[%d] ", index);
  rank->out = (hooprun_output){.rank = rank, .sink = &job->stdout_sink, .name = "stdout"};
  rank->err = (hooprun_output){.rank = rank, .sink = &job->stderr_sink, .name = "stderr"};
}

/* ---- starting ranks ------------------------------------------------------------------------- */

/* A pipe for one of a rank's outputs: the read end goes into output->pipe, the write end (for
 * the rank's fd 1 or 2) into *write_fd. */
static int output_open(hooprun_job *job, hooprun_output *output, uv_file *write_fd) {
  uv_file fds[2];
  int err = uv_pipe(fds, UV_NONBLOCK_PIPE, 0);
  if (err == 0) {
    err = uv_pipe_init(&job->loop, &output->pipe, 0);
    if (err == 0)
      err = uv_pipe_open(&output->pipe, fds[0]);
    if (err != 0) {
      hooprun_close_fd(job, fds[0]);
      hooprun_close_fd(job, fds[1]);
    }
  }
  if (err != 0) {
    hooprun_say(job, "cannot make a pipe for rank %d's %s: %s", output->rank->index, output->name,
                hooprun_error_text(err));
    return -1;
  }
  output->pipe.data = output;
  *write_fd = fds[1];
  return 0;
}

static void on_rank_exit(uv_process_t *process, int64_t exit_status, int term_signal);

/* --bind-to for a rank started on this host: the CPUs it gets into *cpus (and their list into
 * text), from those hooprun was given. 0, or -1 when they cannot be had (more ranks than cores
 * for --bind-to core). */
static int rank_cpus(hooprun_job *job, const hooprun_rank *rank, cpu_set_t *cpus, char *text,
                     size_t textlen) {
  char why[512];
  if (hoop__bind_cpus(job->options.bind, job->options.map, rank->local_rank, rank->local_size,
                      &job->allowed, cpus, why, sizeof why) != 0) {
    hooprun_say(job, "--bind-to %s: %s; bind to none, socket or numa, or start fewer ranks here",
                hoop__bind_name(job->options.bind), why);
    return -1;
  }
  hoop__cpus_format(cpus, text, textlen);
  return 0;
}

/* A pipe holding the token and a newline, its write end already closed: the read end becomes a
 * remote rank's stdin. The token is far below a pipe's capacity, so the write cannot block. */
static int token_pipe(hooprun_job *job) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    hooprun_say(job, "cannot make a pipe for the token: %s", strerror(errno));
    return -1;
  }
  size_t len = strlen(job->token);
  char line[HOOP__MAX_TOKEN + 2];
  memcpy(line, job->token, len);
  line[len] = '\n';
  ssize_t n = write(fds[1], line, len + 1);
  hoop__auth_wipe(line, sizeof line);
  close(fds[1]);
  if (n != (ssize_t)(len + 1)) {
    hooprun_say(job, "cannot write the token into its pipe: %s",
                n < 0 ? strerror(errno) : "short write");
    close(fds[0]);
    return -1;
  }
  return fds[0];
}

/* Start one rank, with its output going to pipes: real pipes (not libuv's socketpairs) so that
 * a rank can open /dev/stdout. Returns 0, or the status hooprun should exit with. */
static int spawn_rank(hooprun_job *job, hooprun_rank *rank) {
  uv_file out_fd, err_fd;
  if (output_open(job, &rank->out, &out_fd) != 0)
    return EXIT_FAILURE;
  if (output_open(job, &rank->err, &err_fd) != 0) {
    hooprun_close_fd(job, out_fd);
    return EXIT_FAILURE;
  }
  /* As with mpirun, rank 0 reads hooprun's stdin; libuv gives the others /dev/null. A rank on
   * another host with a token reads the token from a pipe instead. */
  uv_stdio_container_t stdio[3] = {
      {.flags = rank->index == 0 ? UV_INHERIT_FD : UV_IGNORE, .data.fd = STDIN_FILENO},
      {.flags = UV_INHERIT_FD, .data.fd = out_fd},
      {.flags = UV_INHERIT_FD, .data.fd = err_fd},
  };
  int token_fd = -1;
  if (job->token[0] && rank->host && !rank->host->local) {
    if ((token_fd = token_pipe(job)) < 0) {
      hooprun_close_fd(job, out_fd);
      hooprun_close_fd(job, err_fd);
      return EXIT_FAILURE;
    }
    stdio[0] = (uv_stdio_container_t){.flags = UV_INHERIT_FD, .data.fd = token_fd};
  }
  /* A child starts with the mask of the thread that forks it, and keeps it across exec: each of
   * the rank's threads, from its first, runs where it is bound. */
  int bound = job->options.bind != HOOP__BIND_NONE && (!rank->host || rank->host->local);
  cpu_set_t cpus;
  char cpu_list[256] = "";
  if (bound && (rank_cpus(job, rank, &cpus, cpu_list, sizeof cpu_list) != 0 ||
                sched_setaffinity(0, sizeof cpus, &cpus) != 0)) {
    if (cpu_list[0])
      hooprun_say(job, "cannot bind rank %d to CPUs %s: %s", rank->index, cpu_list,
                  strerror(errno));
    hooprun_close_fd(job, out_fd);
    hooprun_close_fd(job, err_fd);
    if (token_fd >= 0)
      hooprun_close_fd(job, token_fd);
    return EXIT_USAGE;
  }
  char **env = hooprun_rank_environment(job, rank);
  char **command = hooprun_rank_command(job, rank);
  uv_process_options_t spawn = {.exit_cb = on_rank_exit,
                                .file = command[0],
                                .args = command,
                                .env = env,
                                .stdio_count = 3,
                                .stdio = stdio};
  rank->process.data = rank;
  int err = uv_spawn(&job->loop, &rank->process, &spawn);
  if (bound)
    sched_setaffinity(0, sizeof job->allowed, &job->allowed);
  hooprun_env_free(env);
  /* Only the rank may hold the write ends, or the pipes would never reach their end. */
  hooprun_close_fd(job, out_fd);
  hooprun_close_fd(job, err_fd);
  if (token_fd >= 0)
    hooprun_close_fd(job, token_fd);
  if (err != 0) {
    hooprun_say(job, "cannot start '%s': %s", command[0], hooprun_error_text(err));
    hooprun_env_free(command);
    return EXIT_CANNOT_START;
  }
  rank->pid = rank->process.pid;
  rank->running = 1;
  job->running++;
  if (rank->host && !rank->host->local)
    hooprun_verbose(job, "rank %d started on %s as pid %d: %s %s ...", rank->index,
                    rank->host->name, rank->pid, command[0], command[1] ? command[1] : "");
  else
    hooprun_verbose(job, "rank %d started as pid %d%s%s", rank->index, rank->pid,
                    bound ? ", bound to CPUs " : "", cpu_list);
  hooprun_env_free(command);
  hooprun_output_start(job, &rank->out);
  hooprun_output_start(job, &rank->err);
  return 0;
}

void hooprun_start_ranks(hooprun_job *job) {
  hooprun_verbose(job, "starting %d rank%s of '%s'", job->options.np,
                  job->options.np == 1 ? "" : "s", job->options.command[0]);
  hooprun_env_prepare(job);
  if (sched_getaffinity(0, sizeof job->allowed, &job->allowed) != 0) {
    CPU_ZERO(&job->allowed);
    for (long cpu = 0, n = sysconf(_SC_NPROCESSORS_ONLN); cpu < n && cpu < CPU_SETSIZE; cpu++)
      CPU_SET((int)cpu, &job->allowed);
  }
  for (int i = 0; i < job->options.np; i++) {
    int status = spawn_rank(job, &job->ranks[i]);
    if (status != 0) {
      hooprun_job_stop(job, status);
      break;
    }
  }
  hooprun_job_progress(job);
}

/* ---- ranks that exit ------------------------------------------------------------------------ */

/* "exited with status 3" or "was killed by signal 9 (Killed)". */
static void describe_exit(hooprun_text *text, int64_t exit_status, int term_signal) {
  if (term_signal)
    hooprun_text_printf(text, "was killed by signal %d (%s)", term_signal, strsignal(term_signal));
  else
    hooprun_text_printf(text, "exited with status %d", (int)exit_status);
}

/* "rank 3 (pid 812)", or "rank 3 on node2 (pid 812)" where the pid is the remote shell's; a rank
 * on another host reports its exit through its remote shell, as ssh and `ip netns exec` do. */
static void describe_rank(hooprun_text *text, const hooprun_rank *rank) {
  if (rank->host && !rank->host->local)
    hooprun_text_printf(text, "rank %d on %s (pid %d)", rank->index, rank->host->name, rank->pid);
  else
    hooprun_text_printf(text, "rank %d (pid %d)", rank->index, rank->pid);
}

static int spawn_rank(hooprun_job *job, hooprun_rank *rank);

/* --max-np: a replacement for the rank that failed, on its host, in a slot of its own; it joins
 * the running job at the survivors' next generation (hoop_comm_grow). */
static void start_replacement(hooprun_job *job, const hooprun_rank *failed) {
  if (job->rendezvous_over) {
    /* A replacement that failed after the job ended (it came too late to be taken in). */
    hooprun_verbose(job, "no replacement for rank %d: the job is over", failed->index);
    return;
  }
  if (job->nslots == job->capacity) {
    hooprun_say(job, "no replacement for rank %d: %d replacements started, the most for -np %d",
                failed->index, job->capacity - job->options.np, job->options.np);
    return;
  }
  int index = job->nslots++;
  hooprun_init_rank(job, index, failed->host);
  hooprun_rank *rank = &job->ranks[index];
  rank->newcomer = 1;
  rank->local_rank = failed->local_rank; /* its GPU, its cores */
  rank->local_size = failed->local_size;
  if (spawn_rank(job, rank) != 0) {
    hooprun_say(job, "could not start a replacement for rank %d", failed->index);
    return;
  }
  hooprun_say(job,
              "started a replacement for rank %d as [%d] (pid %d)%s%s; it joins at the "
              "others' next growth",
              failed->index, index, rank->pid, rank->host ? " on " : "",
              rank->host ? rank->host->name : "");
}

/* The first rank to fail is the cause, and the job stops; what exits after that was stopped. */
static void report_exit(hooprun_job *job, hooprun_rank *rank, int64_t exit_status,
                        int term_signal) {
  int status = term_signal ? 128 + term_signal : (int)exit_status;
  hooprun_text how = {0};
  describe_rank(&how, rank);
  hooprun_text_append(&how, " ", 1);
  describe_exit(&how, exit_status, term_signal);
  if (job->stopping) {
    hooprun_verbose(job, "%s: stopped by hooprun", how.data);
  } else if (status != 0 && job->options.min_np > 0 &&
             job->running + job->succeeded >= job->options.min_np) {
    /* Elastic: the survivors go on while enough of them are left (or they have finished: a rank
     * left out of the job may fail after the others ended well). */
    if (job->running > 0)
      hooprun_say(job, "%s; the job goes on with %d rank%s (--min-np %d)", how.data, job->running,
                  job->running == 1 ? "" : "s", job->options.min_np);
    else
      hooprun_say(job, "%s, after %d rank%s had finished the job", how.data, job->succeeded,
                  job->succeeded == 1 ? "" : "s");
    hooprun_text_printf(&job->lost_list, "%s%s", job->lost ? "; " : "", how.data);
    job->lost++;
    if (job->options.max_np > 0 && job->running < job->options.max_np)
      start_replacement(job, rank);
  } else if (status != 0) {
    if (job->options.min_np > 0)
      hooprun_say(job, "%s; %d rank%s left, fewer than --min-np %d: stopping the job", how.data,
                  job->running, job->running == 1 ? "" : "s", job->options.min_np);
    else
      hooprun_say(job, "%s", how.data);
    hooprun_job_stop_after_failure(job, status);
  } else {
    job->succeeded++;
    hooprun_verbose(job, "%s", how.data);
    hooprun_job_finished_by_some(job);
  }
  hooprun_text_free(&how);
}

static void on_rank_exit(uv_process_t *process, int64_t exit_status, int term_signal) {
  hooprun_rank *rank = process->data;
  hooprun_job *job = rank->job;
  rank->running = 0;
  job->running--;
  hooprun_output_read_now(job, &rank->out);
  hooprun_output_read_now(job, &rank->err);
  report_exit(job, rank, exit_status, term_signal);
  hooprun_job_progress(job);
}
