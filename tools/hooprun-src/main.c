/* main.c - hooprun's setting up and main(): the job id, the ranks and their hosts, the loop's
 * handles, the rendezvous server (its own with a fresh token, or a hoopd) and the open-file
 * limit; then the loop runs until the job is over. hooprun.h describes the whole. */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "comm/watch.h"
#include "core/log.h"
#include "hooprun.h"
#include "proto/auth.h"
#include "rdzv/server.h"
#include "util/netaddr.h"

/* Descriptors hooprun keeps beside its ranks' (stdio, the loop's own, the listener, a token pipe
 * while a remote rank starts), with room to spare. */
#define OWN_FILES 16

/* ---- setting up ----------------------------------------------------------------------------- */

static int make_job_id(hooprun_job *job) {
  if (job->options.job_id) {
    snprintf(job->id, sizeof job->id, "%s", job->options.job_id);
    return 0;
  }
  unsigned char random[4];
  uv_random_t request;
  int err = uv_random(&job->loop, &request, random, sizeof random, 0, NULL);
  if (err != 0) {
    hooprun_say(job, "cannot make a job id: %s", hooprun_error_text(err));
    return -1;
  }
  snprintf(job->id, sizeof job->id, "hooprun-%ld-%02x%02x%02x%02x", (long)getpid(), random[0],
           random[1], random[2], random[3]);
  return 0;
}

/* Ranks fill the hosts in the order of the list, each host up to its slots. */
static const hooprun_host *host_of_rank(const hooprun_options *options, int index) {
  for (int h = 0; h < options->nhosts; h++) {
    if (index < options->hosts[h].slots)
      return &options->hosts[h];
    index -= options->hosts[h].slots;
  }
  return NULL;
}

/* The slots never move (libuv holds their handles): room for the replacements is made now. */
static void init_ranks(hooprun_job *job) {
  job->capacity = job->options.max_np ? 2 * job->options.np : job->options.np;
  job->ranks = hooprun_xrealloc(NULL, (size_t)job->capacity * sizeof *job->ranks);
  memset(job->ranks, 0, (size_t)job->capacity * sizeof *job->ranks);
  job->nslots = job->options.np;
  for (int i = 0; i < job->options.np; i++)
    hooprun_init_rank(job, i, host_of_rank(&job->options, i));
  for (int i = 0; i < job->options.np; i++)
    for (int j = 0; j < job->options.np; j++)
      if (job->ranks[j].host == job->ranks[i].host) {
        job->ranks[i].local_rank += j < i;
        job->ranks[i].local_size++;
      }
}

static int init_handles(hooprun_job *job) {
  int err;
  if ((err = uv_timer_init(&job->loop, &job->grace_timer)) != 0 ||
      (err = uv_timer_init(&job->loop, &job->drain_timer)) != 0 ||
      (err = uv_timer_init(&job->loop, &job->linger_timer)) != 0 ||
      (err = uv_signal_init(&job->loop, &job->sigint)) != 0 ||
      (err = uv_signal_init(&job->loop, &job->sigterm)) != 0) {
    hooprun_say(job, "cannot set up the event loop: %s", hooprun_error_text(err));
    return -1;
  }
  job->grace_timer.data = job->drain_timer.data = job->linger_timer.data = job;
  job->sigint.data = job->sigterm.data = job;
  if ((err = uv_signal_start(&job->sigint, hooprun_on_signal, SIGINT)) != 0 ||
      (err = uv_signal_start(&job->sigterm, hooprun_on_signal, SIGTERM)) != 0) {
    hooprun_say(job, "cannot catch signals: %s", hooprun_error_text(err));
    return -1;
  }
  return hooprun_report_start(job);
}

static void on_rendezvous_done(void *arg) {
  hooprun_job *job = arg;
  job->rendezvous_over = 1;
  hooprun_verbose(job, "rendezvous of job %s is over", job->id);
}

static const hooprun_host *first_remote_host(const hooprun_options *options) {
  for (int h = 0; h < options->nhosts; h++)
    if (!options->hosts[h].local)
      return &options->hosts[h];
  return NULL;
}

/* The address at which ranks on other hosts reach the embedded server, as text for host:port:
 * HOOP_IFNAME's interface if set; else this host's address on the route to the first remote host;
 * else (its name does not resolve here, as with network namespaces) the first address of an
 * interface that is up and not loopback. */
static int server_address(hooprun_job *job, const hooprun_host *remote, char *out, size_t outlen) {
  const char *ifname = getenv("HOOP_IFNAME");
  struct sockaddr_storage toward, local;
  socklen_t toward_len, local_len;
  char chosen[64], err[256];
  const char *why;
  if (ifname && ifname[0]) {
    why = "HOOP_IFNAME";
    if (hoop__choose_local_addr(ifname, NULL, &local, &local_len, chosen, sizeof chosen, err,
                                sizeof err) != 0) {
      hooprun_say(job, "cannot choose the address for the rendezvous server: %s", err);
      return -1;
    }
  } else if (hoop__resolve(remote->name, 1, &toward, &toward_len, err, sizeof err) == 0 &&
             hoop__choose_local_addr(NULL, (struct sockaddr *)&toward, &local, &local_len, chosen,
                                     sizeof chosen, err, sizeof err) == 0 &&
             !hoop__is_loopback((struct sockaddr *)&local)) {
    why = "the route to the first remote host";
  } else {
    why = "the first interface that is not loopback";
    if (hoop__choose_local_addr("^lo", NULL, &local, &local_len, chosen, sizeof chosen, err,
                                sizeof err) != 0) {
      hooprun_say(job,
                  "cannot choose an address that %s can reach for the rendezvous server: %s (set "
                  "HOOP_IFNAME, or use --rendezvous)",
                  remote->name, err);
      return -1;
    }
  }
  char text[INET6_ADDRSTRLEN];
  const void *bytes = local.ss_family == AF_INET
                          ? (const void *)&((struct sockaddr_in *)&local)->sin_addr
                          : (const void *)&((struct sockaddr_in6 *)&local)->sin6_addr;
  inet_ntop(local.ss_family, bytes, text, sizeof text);
  snprintf(out, outlen, local.ss_family == AF_INET ? "%s" : "[%s]", text);
  hooprun_verbose(job, "ranks reach the rendezvous server at %s (interface %s, from %s)", out,
                  chosen, why);
  return local.ss_family == AF_INET6 ? 6 : 4;
}

/* A job served by hooprun gets a token of its own: 32 random bytes in hex. Nobody but its ranks
 * can join it, even on a shared machine where anyone may reach the port. */
static int fresh_token(hooprun_job *job) {
  unsigned char random[32];
  if (hoop__auth_random(random, sizeof random) != 0) {
    hooprun_say(job, "cannot make the job's token: libsodium cannot start");
    return -1;
  }
  for (size_t i = 0; i < sizeof random; i++)
    snprintf(job->token + 2 * i, 3, "%02x", random[i]);
  hoop__auth_wipe(random, sizeof random);
  return 0;
}

/* With a hoopd, the ranks prove the token that hooprun was given (HOOP_TOKEN or HOOP_TOKEN_FILE),
 * if any, which hooprun hands on to them as it does its own. */
static int given_token(hooprun_job *job) {
  char err[512];
  if (hoop__auth_load_token(getenv("HOOP_TOKEN"), getenv("HOOP_TOKEN_FILE"), job->token,
                            sizeof job->token, err, sizeof err) != 0) {
    hooprun_say(job, "%s", err);
    return -1;
  }
  return 0;
}

/* A connection per rank, and some to spare for strangers: more than a server's usual number
 * only for a job that needs it. */
static int max_connections(const hooprun_job *job) {
  int want = job->options.np + OWN_FILES;
  return want > HOOP__RDZV_MAX_CONNECTIONS ? want : HOOP__RDZV_MAX_CONNECTIONS;
}

/* The embedded server: on 127.0.0.1 when every rank runs here; with other hosts, on every address
 * (the one given to the ranks may have other names here, as in rank 0's own server). */
static int start_server(hooprun_job *job) {
  char err[256], address[INET6_ADDRSTRLEN + 2] = "127.0.0.1";
  const char *listen = "127.0.0.1:0";
  const hooprun_host *remote = first_remote_host(&job->options);
  if (job->options.rendezvous) {
    snprintf(job->rendezvous, sizeof job->rendezvous, "%s", job->options.rendezvous);
    hooprun_verbose(job, "ranks meet at the rendezvous server %s, job %s", job->rendezvous,
                    job->id);
    return given_token(job);
  }
  if (fresh_token(job) != 0)
    return -1;
  if (remote) {
    int family = server_address(job, remote, address, sizeof address);
    if (family < 0)
      return -1;
    listen = family == 6 ? "[::]:0" : "0.0.0.0:0";
  }
  job->rdzv_options = (hoop__rdzv_options){.listen = listen,
                                           .token = job->token,
                                           .max_connections = max_connections(job),
                                           .once = 1,
                                           .elastic = job->options.max_np > 0,
                                           .on_done = on_rendezvous_done,
                                           .arg = job};
  if (hoop__rdzv_server_start(&job->loop, &job->rdzv_options, &job->server, err, sizeof err) != 0) {
    job->server = NULL;
    hooprun_say(job, "cannot start the rendezvous server: %s", err);
    return -1;
  }
  snprintf(job->rendezvous, sizeof job->rendezvous, "%s:%d", address,
           hoop__rdzv_server_port(job->server));
  hooprun_verbose(job, "rendezvous server on %s for job %s", job->rendezvous, job->id);
  return 0;
}

/* hooprun holds the read ends of each rank's stdout and stderr and, with the embedded server, the
 * rank's rendezvous connection. A soft open-file limit of 1024 is common, and past it a rank
 * could not start ("Too many open files") or its connection was dropped at accept() (the rank
 * then failed with "Connection reset by peer"). Raise the limit as far as the hard limit allows;
 * below the ranks' own share, stop before anything starts, saying why; below the room to spare,
 * warn and go on (the job may still fit). */
static int fit_open_files(hooprun_job *job) {
  int np = job->options.np, per_rank = job->options.rendezvous ? 2 : 3;
  long hard, need = (long)np * per_rank, want = need + OWN_FILES;
  long files = hoop__raise_open_files(want, &hard);
  if (files >= want)
    return 0;
  if (files > need) {
    hooprun_say(
        job,
        "warning: the open-file limit is %ld (its hard limit %ld), under the %ld that %d "
        "ranks want here (%d each, and hooprun's own): the job may run short; raise the hard "
        "limit (ulimit -Hn, LimitNOFILE=)",
        files, hard, want, np, per_rank);
    return 0;
  }
  hooprun_say(
      job,
      "%d ranks need about %ld open files here (%d each), but the limit is %ld and its hard "
      "limit %ld: raise the hard limit (ulimit -Hn, LimitNOFILE=) or start fewer ranks",
      np, want, per_rank, files, hard);
  return -1;
}

/* Set up, start the ranks and run the loop until the job is over. */
static void job_run(hooprun_job *job) {
  init_ranks(job);
  if (fit_open_files(job) != 0 || make_job_id(job) != 0 || init_handles(job) != 0) {
    job->exit_code = EXIT_FAILURE;
    return;
  }
  if (start_server(job) != 0) {
    job->exit_code = EXIT_FAILURE;
    hooprun_job_finish(job);
  } else {
    hooprun_start_ranks(job);
  }
  uv_run(&job->loop, UV_RUN_DEFAULT);
}

static void close_handle(uv_handle_t *handle, void *arg) {
  (void)arg;
  if (!uv_is_closing(handle))
    uv_close(handle, NULL);
}

/* Close what is left (exited ranks' process handles, timers, signals) and then the loop. */
static int loop_close(hooprun_job *job) {
  uv_walk(&job->loop, close_handle, NULL);
  uv_run(&job->loop, UV_RUN_DEFAULT);
  int err = uv_loop_close(&job->loop);
  if (err != 0) {
    hooprun_say(job, "cannot close the event loop: %s", hooprun_error_text(err));
    return -1;
  }
  return 0;
}

static int run(hooprun_job *job, int argc, char **argv) {
  int parsed = hooprun_parse_options(job, argc, argv);
  if (parsed != 0)
    return parsed < 0 ? EXIT_USAGE : job->stdout_sink.broken ? EXIT_FAILURE : EXIT_SUCCESS;
  hoop__log_set_prefix("hooprun");
  /* A reader of our output that goes away must not kill hooprun before it stops the ranks. */
  if (signal(SIGPIPE, SIG_IGN) == SIG_ERR) {
    hooprun_say(job, "cannot ignore SIGPIPE: %s", strerror(errno));
    return EXIT_FAILURE;
  }
  int err = uv_loop_init(&job->loop);
  if (err != 0) {
    hooprun_say(job, "cannot make an event loop: %s", hooprun_error_text(err));
    return EXIT_FAILURE;
  }
  job_run(job);
  if (loop_close(job) != 0)
    return EXIT_FAILURE;
  if (job->lost > 0 && !job->stopping)
    hooprun_say(job, "the job finished without %d rank%s: %s", job->lost, job->lost == 1 ? "" : "s",
                job->lost_list.data);
  hooprun_text_free(&job->lost_list);
  hooprun_verbose(job, "exit status %d", job->exit_code);
  return job->exit_code;
}

int main(int argc, char **argv) {
  hooprun_job *job = hooprun_xrealloc(NULL, sizeof *job);
  memset(job, 0, sizeof *job);
  job->stdout_sink = (hooprun_sink){.fd = STDOUT_FILENO, .name = "standard output"};
  job->stderr_sink = (hooprun_sink){.fd = STDERR_FILENO, .name = "standard error"};
  hoop__launcher_identity(job->launcher, sizeof job->launcher);
  int status = run(job, argc, argv);
  free(job->ranks);
  for (int h = 0; h < job->options.nhosts; h++)
    free(job->options.hosts[h].name);
  free(job->options.hosts);
  free(job->options.exports);
  hooprun_text_free(&job->lines);
  hoop__auth_wipe(job->token, sizeof job->token);
  free(job);
  return status;
}
