/* hooprun.h - the job launcher's shared state. `hooprun -np N [-H host:slots,...] prog args...`
 * runs the rendezvous server on its own libuv loop (or uses a hoopd), starts N ranks of prog on
 * this host or, through a remote shell (ssh, `ip netns exec`), on the hosts listed, with the HOOP_
 * variables set, forwards their output line by line tagged with the rank, and stops the whole job
 * when one rank fails.
 *
 * main.c sets the job up (its id, the rendezvous server, the open-file limit) and runs the loop;
 * options.c reads the command line and the host lists; env.c builds a rank's environment and
 * command line; spawn.c starts the ranks, here or through the remote shell, and reports their
 * exits; output.c forwards the ranks' output and holds the sinks, the growable text and hooprun's
 * messages; policy.c stops and finishes the job (the grace and drain timers, signals); report.c
 * reports the job's health (SIGUSR1, --report). */
#ifndef HOOP__HOOPRUN_H
#define HOOP__HOOPRUN_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "core/log.h"
#include "proto/auth.h"
#include "proto/wire.h"
#include "rdzv/server.h"
#include "util/buf.h"
#include "util/cpus.h"

/* Bytes read from a rank's pipe at once, into job->read_buf. */
#define READ_BYTES 65536

/* hooprun's own exit statuses, besides those it passes on from ranks and signals. */
#define EXIT_USAGE 2
#define EXIT_CANNOT_START 127

/* A growable byte buffer, NUL-terminated once it holds anything: util/buf.h's, which hooprun
 * treats as fatal to run out of. */
typedef hoop__buf hooprun_text;

/* hooprun's stdout or stderr. */
typedef struct hooprun_sink {
  int fd;
  const char *name;
  int broken; /* a write failed; what comes later for it is dropped */
} hooprun_sink;

/* A host of -H or --hostfile. */
typedef struct hooprun_host {
  char *name;
  int slots; /* ranks it takes, filled in order of the list */
  int local; /* this host: its ranks are started directly, not through the remote shell */
} hooprun_host;

/* What the command line asked for. */
typedef struct hooprun_options {
  int np;              /* 0 until -np is given */
  hooprun_host *hosts; /* -H and --hostfile, in order; none: every rank on this host */
  int nhosts;
  const char *rsh;        /* --rsh: how a rank starts on another host (default "ssh") */
  const char *rendezvous; /* --rendezvous: an external hoopd's host:port, or NULL */
  const char *timeout;    /* --timeout as given, or NULL */
  int min_np;             /* --min-np: the job goes on while this many ranks run (0: np) */
  int max_np;             /* --max-np: replacements start while fewer ranks run (0: none) */
  const char *job_id;     /* --job, or NULL for a generated id */
  const char **exports;   /* -x arguments, in order */
  int nexports;
  int tag_output;
  int verbose;
  double report_s;       /* --report: seconds between health reports (0: only on SIGUSR1) */
  hoop__bind_level bind; /* --bind-to (default none) */
  hoop__map_level map;   /* --map-by (default core) */
  char **command;        /* prog and its arguments: the tail of argv, ending with NULL */
} hooprun_options;

struct hooprun_job;
struct hooprun_rank;

/* One of a rank's stdout and stderr: the pipe hooprun reads, and the line read so far. */
typedef struct hooprun_output {
  uv_pipe_t pipe;
  struct hooprun_rank *rank;
  hooprun_sink *sink;
  const char *name;     /* "stdout" or "stderr", for messages */
  hooprun_text partial; /* bytes after the last newline */
  int open;             /* being read, and counted in outputs_open */
} hooprun_output;

/* One rank. */
typedef struct hooprun_rank {
  struct hooprun_job *job;
  int index;
  const hooprun_host *host; /* NULL without a host list */
  int pid;                  /* of the rank, or of the remote shell that runs it elsewhere */
  int running;
  int newcomer;               /* a replacement: it joins the running job (HOOP_JOIN=1) */
  int local_rank, local_size; /* its place among its host's ranks (a replacement: the failed's) */
  char tag[24];               /* "[3] ", or "" with --no-tag-output */
  uv_process_t process;
  hooprun_output out;
  hooprun_output err;
} hooprun_rank;

/* The job: its ranks, the rendezvous server and the loop that drives them all. */
typedef struct hooprun_job {
  hooprun_options options;
  char id[HOOP__WIRE_MAX_JOB + 1];
  uv_loop_t loop;
  hoop__rdzv_options rdzv_options; /* kept while the server lives: rdzv/server.h does not say
                                      whether it copies them */
  hoop__rdzv_server *server;
  char rendezvous[HOOP__WIRE_MAX_HOST + 16]; /* host:port, as the ranks get it */
  char token[HOOP__MAX_TOKEN + 1];           /* what the ranks prove to the server; "" for none */
  char launcher[128];   /* HOOP_LAUNCHER: who this hooprun is, so that its ranks end with it */
  int master_port;      /* MASTER_PORT for PyTorch's env:// store on rank 0 (0: not chosen yet) */
  cpu_set_t allowed;    /* the CPUs hooprun may run on: what --bind-to divides among ranks */
  hooprun_rank *ranks;  /* nslots of them used: options.np, then the replacements */
  int nslots, capacity; /* capacity: options.np, twice that with --max-np */
  int running;          /* ranks started and not yet exited */
  int outputs_open;
  int stopping; /* the job is being stopped; exit_code says why */
  int finished;
  int rendezvous_over; /* the job's ranks have all left it: nobody can join it any more */
  int exit_code;
  int lost;               /* ranks that failed while the job went on (--min-np) */
  int succeeded;          /* ranks that exited with 0 */
  hooprun_text lost_list; /* "rank 2 (pid 812) was killed by signal 9", "; "-separated */
  uv_signal_t sigint;
  uv_signal_t sigterm;
  uv_timer_t grace_timer;
  uv_timer_t drain_timer;
  uv_timer_t linger_timer; /* --min-np: ranks still running long after the job finished */
  uv_signal_t sigusr1;     /* a health report (report.c) */
  uv_timer_t report_timer; /* --report's */
  hooprun_sink stdout_sink;
  hooprun_sink stderr_sink;
  hooprun_text lines; /* tagged lines on their way to a sink */
  char read_buf[READ_BYTES];
} hooprun_job;

/* output.c: memory and text; output and messages; forwarding the ranks' output. */
void *hooprun_xrealloc(void *ptr, size_t size);
char *hooprun_xstrdup(const char *text);
void hooprun_text_append(hooprun_text *text, const char *bytes, size_t len);
void hooprun_text_vprintf(hooprun_text *text, const char *fmt, va_list ap);
void hooprun_text_printf(hooprun_text *text, const char *fmt, ...) HOOP__PRINTF(2, 3);
void hooprun_text_free(hooprun_text *text);
const char *hooprun_error_text(int err);
void hooprun_sink_write(hooprun_job *job, hooprun_sink *sink, const char *data, size_t len);
void hooprun_say_va(hooprun_job *job, const char *fmt, va_list ap);
void hooprun_say(hooprun_job *job, const char *fmt, ...) HOOP__PRINTF(2, 3);
void hooprun_verbose(hooprun_job *job, const char *fmt, ...) HOOP__PRINTF(2, 3);
void hooprun_close_fd(hooprun_job *job, int fd);
void hooprun_output_start(hooprun_job *job, hooprun_output *output);
void hooprun_output_read_now(hooprun_job *job, hooprun_output *output);
void hooprun_output_close(hooprun_job *job, hooprun_output *output);

/* options.c: the command line and the host lists. */
int hooprun_parse_options(hooprun_job *job, int argc, char **argv);

/* env.c: a rank's environment and command line, NULL-terminated lists freed by hooprun_env_free. */
char **hooprun_rank_environment(const hooprun_job *job, const hooprun_rank *rank);
/* Choose what every rank's environment shares before the first starts (MASTER_PORT). */
void hooprun_env_prepare(hooprun_job *job);
char **hooprun_rank_command(const hooprun_job *job, const hooprun_rank *rank);
void hooprun_env_free(char **entries);

/* spawn.c: starting the ranks. */
void hooprun_start_ranks(hooprun_job *job);
/* spawn.c: a rank's slot set up (index, host, tag, outputs). */
void hooprun_init_rank(hooprun_job *job, int index, const hooprun_host *host);

/* policy.c: stopping and finishing the job. */
void hooprun_job_stop(hooprun_job *job, int exit_code);
/* A rank failed: the others get a moment to end on their own (each reporting the failure), then
 * are stopped as by hooprun_job_stop. */
void hooprun_job_stop_after_failure(hooprun_job *job, int exit_code);
void hooprun_job_finished_by_some(hooprun_job *job);
void hooprun_job_progress(hooprun_job *job);
void hooprun_job_finish(hooprun_job *job);
void hooprun_on_signal(uv_signal_t *handle, int signum);

/* report.c: the job's health on stderr, now, on SIGUSR1 and every --report seconds. */
void hooprun_report(hooprun_job *job);
int hooprun_report_start(hooprun_job *job);
void hooprun_report_stop(hooprun_job *job);

#endif
