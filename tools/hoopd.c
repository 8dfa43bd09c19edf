/* hoopd.c - the rendezvous daemon: serves any number of jobs on one TCP port until SIGTERM or
 * SIGINT. With --status it is a client instead: it asks a running daemon which jobs are waiting
 * and who is missing. */
#include "config.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "core/env.h"
#include "core/log.h"
#include "hoopd_metrics.h"
#include "proto/auth.h"
#include "proto/wire.h"
#include "rdzv/client.h"
#include "rdzv/server.h"
#include "util/buf.h"
#include "util/netaddr.h"

#define DEFAULT_LISTEN "0.0.0.0:29400"
#define STATUS_TIMEOUT_S 10.0

typedef struct hoopd_args {
  const char *listen;
  const char *status;     /* --status ADDR, or NULL to serve */
  const char *dump;       /* --dump ADDR, or NULL */
  const char *dump_job;   /* the job --dump asks about */
  const char *token_file; /* --token-file, or NULL */
  const char *metrics;    /* --metrics ADDR, or NULL */
  const char *metrics_token_file;
  int max_jobs;
  int idle_per_address;
  double idle_timeout_s;
  int keepalive_s;
  int require_encrypt;
  int verbose;
} hoopd_args;

typedef struct hoopd_daemon {
  hoop__rdzv_server *server;
  hoopd_metrics *metrics;
  uv_signal_t sigterm, sigint;
} hoopd_daemon;

static void usage(FILE *out) {
  fprintf(out,
          "Usage: hoopd [OPTIONS]\n"
          "       hoopd --status ADDR:PORT\n"
          "       hoopd --dump ADDR:PORT JOB\n"
          "\n"
          "The hoop rendezvous daemon: ranks of any number of jobs meet here, each job keyed by\n"
          "its id (HOOP_JOB), and receive the rank table once all of them have joined.\n"
          "\n"
          "  --listen ADDR:PORT   address to listen on (default %s); \":PORT\" is every IPv4\n"
          "                       address, \"[::]:PORT\" every IPv4 and IPv6 address\n"
          "  --max-jobs N         jobs waiting at once (default 1024)\n"
          "  --idle-per-address N keep at most N connections from one address that have sent\n"
          "                       no request for a second (default 64; a newer one closes\n"
          "                       the oldest); raise it past the ranks a host runs at once\n"
          "  --idle-timeout S     close a connection that sends no complete request within S\n"
          "                       seconds (default 30); ranks that joined wait for their job\n"
          "  --keepalive S        drop a connection whose host stops answering (TCP keepalive\n"
          "                       probes) after about S seconds (default 300), or a rank's own\n"
          "                       HOOP_TIMEOUT when longer, and tell its job's other ranks\n"
          "  --token-file FILE    admit only ranks (and status queries) that prove they know\n"
          "                       the token in FILE (mode 600); without it HOOP_TOKEN_FILE or\n"
          "                       HOOP_TOKEN is used if set; see hoopd(8) for the trust model\n"
          "  --require-encrypt    admit only ranks that seal their TCP connections\n"
          "                       (HOOP_ENCRYPT=1 or a cipher, hooprun --encrypt)\n"
          "  --status ADDR:PORT   print the jobs a running daemon is waiting for, and those it\n"
          "                       runs with their health (call rate, time waiting, the ranks\n"
          "                       the others wait for), then exit\n"
          "  --dump ADDR:PORT JOB print every rank's flight recorder of the running job JOB\n"
          "                       (its running call, whom it waits for, its last calls),\n"
          "                       fetched through the daemon without stopping the job\n"
          "  --metrics ADDR:PORT  serve Prometheus metrics at http://ADDR:PORT/metrics (jobs,\n"
          "                       ranks, joins, refusals, failures; per running job its call\n"
          "                       rate, bytes, time waiting, late ranks); a non-loopback\n"
          "                       address needs --metrics-token-file\n"
          "  --metrics-token-file FILE  a token scrapers must send (Authorization: Bearer);\n"
          "                       not the ranks' token\n"
          "  -v, --verbose        log more (trace level)\n"
          "  --help               print this help and exit\n"
          "  --version            print the version and exit\n"
          "\n"
          "Logs go to stderr. SIGTERM or SIGINT stops the daemon; waiting ranks see it close.\n",
          DEFAULT_LISTEN);
}

enum {
  OPT_LISTEN = 256,
  OPT_MAX_JOBS,
  OPT_IDLE_PER_ADDRESS,
  OPT_IDLE,
  OPT_KEEPALIVE,
  OPT_STATUS,
  OPT_DUMP,
  OPT_TOKEN_FILE,
  OPT_METRICS,
  OPT_METRICS_TOKEN_FILE,
  OPT_REQUIRE_ENCRYPT,
  OPT_HELP,
  OPT_VERSION
};

static const struct option long_options[] = {
    {"listen", required_argument, NULL, OPT_LISTEN},
    {"max-jobs", required_argument, NULL, OPT_MAX_JOBS},
    {"idle-per-address", required_argument, NULL, OPT_IDLE_PER_ADDRESS},
    {"idle-timeout", required_argument, NULL, OPT_IDLE},
    {"keepalive", required_argument, NULL, OPT_KEEPALIVE},
    {"status", required_argument, NULL, OPT_STATUS},
    {"dump", required_argument, NULL, OPT_DUMP},
    {"token-file", required_argument, NULL, OPT_TOKEN_FILE},
    {"metrics", required_argument, NULL, OPT_METRICS},
    {"metrics-token-file", required_argument, NULL, OPT_METRICS_TOKEN_FILE},
    {"require-encrypt", no_argument, NULL, OPT_REQUIRE_ENCRYPT},
    {"verbose", no_argument, NULL, 'v'},
    {"help", no_argument, NULL, OPT_HELP},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

/* 0: go on; 1: exit 0 (--help, --version); -1: exit 2 with the message printed. */
static int parse_args(int argc, char **argv, hoopd_args *args) {
  long jobs, count, seconds;
  int opt;
  while ((opt = getopt_long(argc, argv, "v", long_options, NULL)) != -1) {
    switch (opt) {
    case OPT_LISTEN: args->listen = optarg; break;
    case OPT_REQUIRE_ENCRYPT: args->require_encrypt = 1; break;
    case OPT_MAX_JOBS:
      if (hoop__parse_int(optarg, 1, 1000000, &jobs) != 0) {
        fprintf(stderr, "hoopd: --max-jobs '%s' is not a number from 1 to 1000000\n", optarg);
        return -1;
      }
      args->max_jobs = (int)jobs;
      break;
    case OPT_IDLE_PER_ADDRESS:
      if (hoop__parse_int(optarg, 1, 1000000, &count) != 0) {
        fprintf(stderr, "hoopd: --idle-per-address '%s' is not a number from 1 to 1000000\n",
                optarg);
        return -1;
      }
      args->idle_per_address = (int)count;
      break;
    case OPT_IDLE:
      if (hoop__parse_double(optarg, 0.001, 1e6, &args->idle_timeout_s) != 0) {
        fprintf(stderr, "hoopd: --idle-timeout '%s' is not a number of seconds (0.001-1e6)\n",
                optarg);
        return -1;
      }
      break;
    case OPT_KEEPALIVE:
      if (hoop__parse_int(optarg, 5, 86400, &seconds) != 0) {
        fprintf(stderr, "hoopd: --keepalive '%s' is not a number of seconds from 5 to 86400\n",
                optarg);
        return -1;
      }
      args->keepalive_s = (int)seconds;
      break;
    case OPT_STATUS: args->status = optarg; break;
    case OPT_DUMP: args->dump = optarg; break;
    case OPT_TOKEN_FILE: args->token_file = optarg; break;
    case OPT_METRICS: args->metrics = optarg; break;
    case OPT_METRICS_TOKEN_FILE: args->metrics_token_file = optarg; break;
    case 'v': args->verbose = 1; break;
    case OPT_HELP: usage(stdout); return 1;
    case OPT_VERSION: printf("hoopd (hoop) %s\n", PACKAGE_VERSION); return 1;
    default: fprintf(stderr, "Try 'hoopd --help'.\n"); return -1;
    }
  }
  if (args->dump && optind < argc)
    args->dump_job = argv[optind++];
  if (args->dump && !args->dump_job) {
    fprintf(stderr, "hoopd: --dump needs the job's id: hoopd --dump ADDR:PORT JOB\n");
    return -1;
  }
  if (optind < argc) {
    fprintf(stderr, "hoopd: unexpected argument '%s'\nTry 'hoopd --help'.\n", argv[optind]);
    return -1;
  }
  return 0;
}

/* ---- hoopd --status -------------------------------------------------------------------------- */

/* "1, 4, 7 and 12 more", or why no rank numbers are known yet. */
static void describe_missing(const hoop__job_status *job, char *out, size_t outlen) {
  uint32_t missing = job->size - job->joined;
  size_t len = 0;
  out[0] = '\0';
  if (job->nmissing == 0) {
    snprintf(out, outlen, "%u (ranks are assigned when all have joined)", missing);
    return;
  }
  for (uint32_t i = 0; i < job->nmissing && len < outlen; i++) {
    int n = snprintf(out + len, outlen - len, "%s%d", i ? ", " : "", job->missing[i]);
    len += n > 0 ? (size_t)n : 0;
  }
  if (missing > job->nmissing && len < outlen)
    snprintf(out + len, outlen - len, " and %u more", missing - job->nmissing);
}

/* "    joined from: node1 (2 ranks), node2 (1 rank) and 3 ranks from other hosts" */
static void print_hosts(const hoop__job_status *job) {
  if (job->nhosts == 0)
    return;
  uint32_t listed = 0;
  printf("    joined from: ");
  for (uint32_t h = 0; h < job->nhosts; h++) {
    printf("%s%s (%u rank%s)", h ? ", " : "", job->hosts[h].name, job->hosts[h].ranks,
           job->hosts[h].ranks == 1 ? "" : "s");
    listed += job->hosts[h].ranks;
  }
  if (listed < job->joined)
    printf(" and %u ranks from other hosts", job->joined - listed);
  printf("\n");
}

/* The running jobs: their ranks, call rate, time waiting and the ranks the others waited for. */
static void print_running(const hoop__status *status) {
  int header = 0;
  for (uint32_t i = 0; i < status->njobs; i++) {
    const hoop__job_status *job = &status->jobs[i];
    const hoop__job_health *health = &job->health;
    if (!health->running)
      continue;
    if (!header++)
      printf("%-24s %-13s %-10s %-9s %s\n", "RUNNING JOB", "RANKS", "CALLS/S", "WAITING",
             "LATE RANKS: how much later than the first they come (median over the calls)");
    char ranks[32], rate[32], waiting[32];
    snprintf(ranks, sizeof ranks, "%u/%u", job->joined, job->size);
    if (health->reporting == 0) {
      printf("%-24s %-13s (no rank has reported yet: HOOP_STATS_PERIOD=0, or it just began)\n",
             job->job, ranks);
      continue;
    }
    snprintf(rate, sizeof rate, "%u", health->calls_per_s);
    snprintf(waiting, sizeof waiting, "%.1f%%", health->wait_permille / 10.0);
    hoop__buf text = {0};
    hoop__health_late_text(health, &text);
    printf("%-24s %-13s %-10s %-9s %s\n", job->job, ranks, rate, waiting,
           text.data ? text.data : "");
    if (health->calls > 0)
      printf("    over the last %u calls that need every rank, %u of %u ranks reporting\n",
             health->calls, health->reporting, job->size);
    text.len = 0;
    if (health->nlinks > 0) {
      hoop__health_links_text(health, &text);
      printf("    slowest links (large messages, first byte to last): %s\n", text.data);
    }
    hoop__buf_free(&text);
  }
}

static void print_status(const hoop__status *status) {
  uint32_t waiting = 0;
  for (uint32_t i = 0; i < status->njobs; i++)
    waiting += !status->jobs[i].health.running;
  if (waiting == 0) {
    printf("no jobs waiting\n");
  } else {
    printf("%-24s %-13s %-10s %s\n", "JOB", "JOINED/SIZE", "WAITED", "MISSING RANKS");
    for (uint32_t i = 0; i < status->njobs; i++) {
      const hoop__job_status *job = &status->jobs[i];
      if (job->health.running)
        continue;
      char joined[32], waited[32], missing[1024];
      snprintf(joined, sizeof joined, "%u/%u", job->joined, job->size);
      snprintf(waited, sizeof waited, "%.1f s", job->waited_ms / 1000.0);
      describe_missing(job, missing, sizeof missing);
      printf("%-24s %-13s %-10s %s\n", job->job, joined, waited, missing);
      print_hosts(job);
    }
  }
  print_running(status);
}

/* The token from --token-file, which overrides the environment, else from HOOP_TOKEN_FILE or
 * HOOP_TOKEN (one of them), into out ("" for none); -1 with the reason printed. */
static int load_token(const hoopd_args *args, char *out, size_t cap) {
  char err[512];
  int rc = args->token_file
               ? hoop__auth_load_token(NULL, args->token_file, out, cap, err, sizeof err)
               : hoop__auth_load_token(getenv("HOOP_TOKEN"), getenv("HOOP_TOKEN_FILE"), out, cap,
                                       err, sizeof err);
  if (rc != 0)
    fprintf(stderr, "hoopd: %s\n", err);
  return rc;
}

/* The daemon's address: 0, 2 (not an address) or 1 (it does not resolve), said on stderr. */
static int daemon_address(const char *option, const char *where, struct sockaddr_storage *addr,
                          socklen_t *addrlen) {
  char host[HOOP__WIRE_MAX_HOST + 1], err[512];
  int port;
  if (hoop__split_hostport(where, host, sizeof host, &port) != 0 || port == 0) {
    fprintf(stderr, "hoopd: %s '%s' is not host:port or [v6]:port\n", option, where);
    return 2;
  }
  if (hoop__resolve(host[0] ? host : "127.0.0.1", port, addr, addrlen, err, sizeof err) != 0) {
    fprintf(stderr, "hoopd: %s\n", err);
    return 1;
  }
  return 0;
}

/* A rank's text as it came, but for control bytes (other than line ends), which a member could
 * send to the operator's terminal: shown as '?'. Each line indented. */
static void print_text(const char *text) {
  printf("    ");
  for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
    if (*p == '\n')
      printf(p[1] ? "\n    " : "\n");
    else
      putchar(*p < 0x20 || *p == 0x7f ? '?' : *p);
  }
  if (!text[0] || text[strlen(text) - 1] != '\n')
    printf("\n");
}

static int show_dump(const char *where, const char *job, const char *token) {
  struct sockaddr_storage addr;
  socklen_t addrlen;
  char err[512];
  int rc = daemon_address("--dump", where, &addr, &addrlen);
  if (rc != 0)
    return rc;
  hoop__dump_reply reply;
  if (hoop__rendezvous_dump((struct sockaddr *)&addr, addrlen,
                            HOOP__DUMP_WAIT_MS / 1000.0 + STATUS_TIMEOUT_S, token, job, &reply, err,
                            sizeof err) != HOOP_OK) {
    fprintf(stderr, "hoopd: %s\n", err);
    return 1;
  }
  printf("job '%s': %u ranks\n", job, reply.n);
  for (uint32_t i = 0; i < reply.n; i++) {
    printf("rank %u:\n", reply.entries[i].rank);
    print_text(reply.entries[i].text);
  }
  hoop__dump_reply_free(&reply);
  return 0;
}

static int show_status(const char *where, const char *token) {
  struct sockaddr_storage addr;
  socklen_t addrlen;
  char err[512];
  int rc = daemon_address("--status", where, &addr, &addrlen);
  if (rc != 0)
    return rc;
  hoop__status status;
  if (hoop__rendezvous_status((struct sockaddr *)&addr, addrlen, STATUS_TIMEOUT_S, token, &status,
                              err, sizeof err) != HOOP_OK) {
    fprintf(stderr, "hoopd: %s\n", err);
    return 1;
  }
  print_status(&status);
  hoop__status_free(&status);
  return 0;
}

/* ---- the daemon ------------------------------------------------------------------------------ */

static void on_signal(uv_signal_t *handle, int signum) {
  hoopd_daemon *daemon = handle->data;
  HOOP__INFO(HOOP_SUBSYS_RDZV, "%s: shutting down", signum == SIGTERM ? "SIGTERM" : "SIGINT");
  hoopd_metrics_close(daemon->metrics);
  hoop__rdzv_server_close(daemon->server);
  uv_close((uv_handle_t *)&daemon->sigterm, NULL);
  uv_close((uv_handle_t *)&daemon->sigint, NULL);
}

static int watch_signal(uv_loop_t *loop, uv_signal_t *handle, int signum, hoopd_daemon *daemon) {
  int rc = uv_signal_init(loop, handle);
  if (rc == 0) {
    handle->data = daemon;
    rc = uv_signal_start(handle, on_signal, signum);
  }
  if (rc != 0)
    fprintf(stderr, "hoopd: watching signal %d: %s\n", signum, uv_strerror(rc));
  return rc;
}

/* Descriptors the daemon keeps beside its clients' connections (the loop, the listener, stdio,
 * signals), with room to spare. */
#define OWN_FILES 64

/* A running job's ranks hold a connection each, but a soft open-file limit of 1024 is common:
 * raise it towards what HOOP__RDZV_MAX_CONNECTIONS needs, as far as the hard limit allows, and
 * return the connections that fit. A client past them is then refused with the reason, instead
 * of accepted and dropped at once when accept() fails for want of a descriptor. */
static int fit_connections(void) {
  long hard, files = hoop__raise_open_files(HOOP__RDZV_MAX_CONNECTIONS + OWN_FILES, &hard);
  if (files >= HOOP__RDZV_MAX_CONNECTIONS + OWN_FILES)
    return HOOP__RDZV_MAX_CONNECTIONS;
  int fit = (int)(files > 2 * OWN_FILES ? files - OWN_FILES : files / 2);
  HOOP__WARN(HOOP_SUBSYS_RDZV,
             "the open-file limit is %ld (its hard limit %ld): serving at most "
             "%d connections at once, not %d; raise it (ulimit -Hn, LimitNOFILE=) to serve more",
             files, hard, fit, HOOP__RDZV_MAX_CONNECTIONS);
  return fit;
}

/* --metrics, with its own token (never the ranks'), read from its file. */
static int start_metrics(const hoopd_args *args, uv_loop_t *loop, hoopd_daemon *daemon, char *err,
                         size_t errlen) {
  char bearer[HOOP__MAX_TOKEN + 1] = "";
  if (args->metrics_token_file && hoop__auth_load_token(NULL, args->metrics_token_file, bearer,
                                                        sizeof bearer, err, errlen) != 0)
    return -1;
  int rc = hoopd_metrics_start(loop, daemon->server, args->metrics, bearer, &daemon->metrics, err,
                               errlen);
  hoop__auth_wipe(bearer, sizeof bearer);
  return rc;
}

static int serve(const hoopd_args *args, const char *token) {
  /* A client that hangs up while we write must not kill the daemon: the write fails instead. */
  if (signal(SIGPIPE, SIG_IGN) == SIG_ERR) {
    perror("hoopd: signal(SIGPIPE)");
    return 1;
  }
  hoopd_daemon daemon = {0};
  hoop__rdzv_options options = {0};
  options.listen = args->listen;
  options.max_jobs = args->max_jobs;
  options.max_idle_per_address = args->idle_per_address;
  options.idle_timeout_s = args->idle_timeout_s;
  options.keepalive_s = args->keepalive_s;
  options.require_sealed = args->require_encrypt;
  options.token = token;
  options.max_connections = fit_connections();
  char err[512];
  uv_loop_t *loop = uv_default_loop();
  if (hoop__rdzv_server_start(loop, &options, &daemon.server, err, sizeof err) != 0) {
    fprintf(stderr, "hoopd: %s\n", err);
    return 1;
  }
  if (args->metrics && start_metrics(args, loop, &daemon, err, sizeof err) != 0) {
    fprintf(stderr, "hoopd: %s\n", err);
    hoop__rdzv_server_close(daemon.server);
    uv_run(loop, UV_RUN_DEFAULT);
    return 1;
  }
  if (token[0])
    HOOP__INFO(HOOP_SUBSYS_RDZV,
               "authentication on: ranks and status queries must prove the token");
  else
    HOOP__WARN(HOOP_SUBSYS_RDZV, "authentication off: anyone who reaches this port may join a job "
                                 "(give hoopd --token-file to keep strangers out)");
  if (watch_signal(loop, &daemon.sigterm, SIGTERM, &daemon) != 0 ||
      watch_signal(loop, &daemon.sigint, SIGINT, &daemon) != 0)
    return 1;
  uv_run(loop, UV_RUN_DEFAULT);
  int rc = uv_loop_close(loop);
  if (rc != 0) {
    fprintf(stderr, "hoopd: uv_loop_close: %s\n", uv_strerror(rc));
    return 1;
  }
  HOOP__INFO(HOOP_SUBSYS_RDZV, "stopped");
  return 0;
}

int main(int argc, char **argv) {
  hoopd_args args = {.listen = DEFAULT_LISTEN};
  int rc = parse_args(argc, argv, &args);
  if (rc != 0)
    return rc > 0 ? 0 : 2;
  static char token[HOOP__MAX_TOKEN + 1];
  if (load_token(&args, token, sizeof token) != 0)
    return 2;
  if (args.status) {
    rc = show_status(args.status, token);
  } else if (args.dump) {
    rc = show_dump(args.dump, args.dump_job, token);
  } else {
    hoop__log_set(args.verbose ? HOOP_LOG_TRACE : HOOP_LOG_INFO, HOOP_SUBSYS_ALL);
    hoop__log_set_prefix("hoopd");
    rc = serve(&args, token);
  }
  hoop__auth_wipe(token, sizeof token);
  return rc;
}
