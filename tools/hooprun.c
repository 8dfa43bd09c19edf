/* hooprun.c - the job launcher: `hooprun -np N [-H host:slots,...] prog args...` runs the
 * rendezvous server on its own libuv loop (or uses a hoopd), starts N ranks of prog on this host
 * or, through a remote shell (ssh, `ip netns exec`), on the hosts listed, with the HOOP_ variables
 * set, forwards their output line by line tagged with the rank, and stops the whole job when one
 * rank fails. */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "core/env.h"
#include "core/log.h"
#include "rdzv/auth.h"
#include "rdzv/server.h"
#include "rdzv/wire.h"
#include "util/netaddr.h"

/* How long ranks get to exit after SIGTERM before they get SIGKILL. */
#define GRACE_MS 3000
/* A rank's own output is read as soon as it exits; a pipe still open this long after the last
 * rank's exit is held by a process a rank left behind, and hooprun stops reading it (which
 * also ends a writer that keeps going, by EPIPE). */
#define DRAIN_MS 1000
/* A longer line is forwarded in pieces, so that output without newlines cannot make hooprun's
 * memory grow without bound. */
#define LINE_MAX_BYTES (1024 * 1024)
#define READ_BYTES 65536
/* Reads at once from a rank that has just exited: 16 x 64 KiB empty even a pipe grown to the
 * 1 MiB an unprivileged process may ask for; anything more comes from a process the rank left
 * behind, and the loop reads that as usual. */
#define EXIT_READS 16

/* hooprun's own exit statuses, besides those it passes on from ranks and signals. */
#define EXIT_USAGE 2
#define EXIT_CANNOT_START 127

/* Descriptors hooprun keeps beside its ranks' (stdio, the loop's own, the listener, a token pipe
 * while a remote rank starts), with room to spare. */
#define OWN_FILES 16

/* A growable byte buffer, NUL-terminated once it holds anything. */
typedef struct hooprun_text {
  char *data;
  size_t len;
  size_t cap;
} hooprun_text;

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
  const char *job_id;     /* --job, or NULL for a generated id */
  const char **exports;   /* -x arguments, in order */
  int nexports;
  int tag_output;
  int verbose;
  char **command; /* prog and its arguments: the tail of argv, ending with NULL */
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
  char tag[24]; /* "[3] ", or "" with --no-tag-output */
  uv_process_t process;
  hooprun_output out;
  hooprun_output err;
} hooprun_rank;

/* The job: its ranks, the rendezvous server and the loop that drives them all. */
typedef struct hooprun_job {
  hooprun_options options;
  char id[HOOP_WIRE_MAX_JOB + 1];
  uv_loop_t loop;
  hoop__rdzv_options rdzv_options; /* kept while the server lives: rdzv/server.h does not say
                                      whether it copies them */
  hoop__rdzv_server *server;
  char rendezvous[HOOP_WIRE_MAX_HOST + 16]; /* host:port, as the ranks get it */
  char token[HOOP_MAX_TOKEN + 1];           /* what the ranks prove to the server; "" for none */
  hooprun_rank *ranks;                      /* options.np of them */
  int running;                              /* ranks started and not yet exited */
  int outputs_open;
  int stopping; /* the job is being stopped; exit_code says why */
  int finished;
  int exit_code;
  uv_signal_t sigint;
  uv_signal_t sigterm;
  uv_timer_t grace_timer;
  uv_timer_t drain_timer;
  hooprun_sink stdout_sink;
  hooprun_sink stderr_sink;
  hooprun_text lines; /* tagged lines on their way to a sink */
  char read_buf[READ_BYTES];
} hooprun_job;

static void job_stop(hooprun_job *job, int exit_code);
static void job_progress(hooprun_job *job);

/* ---- memory and text ------------------------------------------------------------------------ */

static void *xrealloc(void *ptr, size_t size) {
  void *grown = realloc(ptr, size);
  if (!grown) {
    /* Nothing sensible is left to do; the ranks see their output pipes close. */
    fputs("hooprun: out of memory\n", stderr);
    exit(EXIT_FAILURE);
  }
  return grown;
}

static char *xstrdup(const char *text) {
  size_t size = strlen(text) + 1;
  return memcpy(xrealloc(NULL, size), text, size);
}

static void text_reserve(hooprun_text *text, size_t more) {
  if (text->len + more < text->cap)
    return;
  size_t cap = text->cap ? text->cap : 256;
  while (cap <= text->len + more)
    cap *= 2;
  text->data = xrealloc(text->data, cap);
  text->cap = cap;
}

static void text_append(hooprun_text *text, const char *bytes, size_t len) {
  if (len == 0)
    return;
  text_reserve(text, len);
  memcpy(text->data + text->len, bytes, len);
  text->len += len;
  text->data[text->len] = '\0';
}

static void text_vprintf(hooprun_text *text, const char *fmt, va_list ap) {
  va_list again;
  va_copy(again, ap);
  int len = vsnprintf(NULL, 0, fmt, again);
  va_end(again);
  if (len <= 0)
    return;
  text_reserve(text, (size_t)len);
  vsnprintf(text->data + text->len, (size_t)len + 1, fmt, ap);
  text->len += (size_t)len;
}

static void text_printf(hooprun_text *text, const char *fmt, ...) HOOP__PRINTF(2, 3);
static void text_printf(hooprun_text *text, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  text_vprintf(text, fmt, ap);
  va_end(ap);
}

static void text_free(hooprun_text *text) {
  free(text->data);
  *text = (hooprun_text){0};
}

/* ---- output and messages -------------------------------------------------------------------- */

/* libuv's codes are negated errno values on Unix, except its own (UV_EOF, UV_EAI_*) below -1000;
 * strerror words the first as users know them ("No such file or directory"). */
static const char *error_text(int err) {
  return err > -1000 ? strerror(-err) : uv_strerror(err);
}

/* Returns 0 or an errno value. */
static int write_all(int fd, const char *data, size_t len) {
  while (len > 0) {
    ssize_t written = write(fd, data, len);
    if (written >= 0) {
      data += written;
      len -= (size_t)written;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      /* Whoever opened the descriptor made it non-blocking: wait until it takes more. */
      struct pollfd ready = {.fd = fd, .events = POLLOUT};
      if (poll(&ready, 1, -1) < 0 && errno != EINTR)
        return errno;
    } else if (errno != EINTR) {
      return errno;
    }
  }
  return 0;
}

static void say(hooprun_job *job, const char *fmt, ...) HOOP__PRINTF(2, 3);

/* Each call writes whole lines at once, so lines from different ranks never mix. */
static void sink_write(hooprun_job *job, hooprun_sink *sink, const char *data, size_t len) {
  if (sink->broken || len == 0)
    return;
  int err = write_all(sink->fd, data, len);
  if (err == 0)
    return;
  sink->broken = 1;
  say(job, "cannot write to %s: %s", sink->name, strerror(err));
  job_stop(job, EXIT_FAILURE);
}

static void say_va(hooprun_job *job, const char *fmt, va_list ap) {
  hooprun_text line = {0};
  text_append(&line, "hooprun: ", 9);
  text_vprintf(&line, fmt, ap);
  text_append(&line, "\n", 1);
  sink_write(job, &job->stderr_sink, line.data, line.len);
  text_free(&line);
}

/* A message for the user on stderr. */
static void say(hooprun_job *job, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  say_va(job, fmt, ap);
  va_end(ap);
}

/* A message for --verbose only. */
static void verbose(hooprun_job *job, const char *fmt, ...) HOOP__PRINTF(2, 3);
static void verbose(hooprun_job *job, const char *fmt, ...) {
  if (!job->options.verbose)
    return;
  va_list ap;
  va_start(ap, fmt);
  say_va(job, fmt, ap);
  va_end(ap);
}

static void close_fd(hooprun_job *job, int fd) {
  if (close(fd) != 0)
    say(job, "close(%d): %s", fd, strerror(errno));
}

/* ---- command line --------------------------------------------------------------------------- */

static const char help_text[] =
    "Usage: hooprun -np N [options] prog [args...]\n"
    "       hooprun [-np N] -H host:slots,... [options] prog [args...]\n"
    "Start N ranks of prog as one hoop job, on this host or on the hosts listed. hooprun serves\n"
    "the rendezvous itself, gives each rank HOOP_RENDEZVOUS, HOOP_JOB, HOOP_SIZE and HOOP_RANK,\n"
    "prefixes each line the ranks print with their rank, and stops every rank when one fails.\n"
    "\n"
    "Options (they end at the first argument that is not one, or at --):\n"
    "  -np N, -n N, --np N  number of ranks (1 to 16384; default with hosts: all their slots)\n"
    "  -H, --host LIST      hosts as host[:slots],... (1 slot if not given); ranks fill them in\n"
    "                       order, each host's ranks contiguous\n"
    "  --hostfile FILE      hosts one per line as 'host [slots=N]'; # starts a comment\n"
    "  --rsh CMD            how to start a rank on another host (default: ssh); hooprun runs\n"
    "                       CMD HOST env HOOP_...=... -x settings... prog args\n"
    "  --rendezvous H:P     use the hoopd at H:P instead of serving the rendezvous itself;\n"
    "                       ranks prove hooprun's HOOP_TOKEN or HOOP_TOKEN_FILE to it, if set\n"
    "  --timeout S          seconds any blocking step of a rank may take (HOOP_TIMEOUT)\n"
    "  -x VAR               pass VAR on to the ranks (on this host they get it anyway)\n"
    "  -x VAR=VALUE         set VAR to VALUE for the ranks\n"
    "  --job ID             job id (default: hooprun-<pid>-<random hex>)\n"
    "  --tag-output         prefix each line of the ranks' output with \"[rank] \" (default)\n"
    "  --no-tag-output      forward the ranks' lines as they are\n"
    "  -v, --verbose        say on stderr what hooprun does: server port, starts, exits\n"
    "  -h, --help           show this help and exit\n"
    "  --version            show the version and exit\n"
    "\n"
    "A job whose rendezvous hooprun serves gets a fresh random token (HOOP_TOKEN), so that only\n"
    "its ranks can join it; ranks on other hosts read it from their stdin.\n"
    "Ranks read stdin (rank 0 only) and inherit hooprun's environment (on other hosts: what the\n"
    "remote shell gives them, plus -x and the HOOP_ variables). With other hosts, the embedded\n"
    "server listens on every address and ranks get the one that routes to the first remote host\n"
    "(HOOP_IFNAME picks the interface instead). On a rank's failure, or on SIGINT or SIGTERM, the\n"
    "other ranks (or their remote shells) get SIGTERM, and SIGKILL 3 s later.\n"
    "\n"
    "Exit status: 0 if every rank exited with 0; else the status of the first rank that failed\n"
    "(128+N if signal N killed it); 128+N if hooprun got signal N; 127 if prog cannot be started;\n"
    "2 for a usage error; 1 for any other error of hooprun's.\n";

typedef enum option_id {
  OPT_NP,
  OPT_HOSTS,
  OPT_HOSTFILE,
  OPT_RSH,
  OPT_RENDEZVOUS,
  OPT_TIMEOUT,
  OPT_EXPORT,
  OPT_JOB,
  OPT_TAG,
  OPT_NO_TAG,
  OPT_VERBOSE,
  OPT_HELP,
  OPT_VERSION
} option_id;

static const struct {
  const char *names[3]; /* spellings; unused slots are NULL */
  int takes_value;
  option_id id;
} option_table[] = {
    {{"-np", "-n", "--np"}, 1, OPT_NP},
    {{"-H", "--host"}, 1, OPT_HOSTS},
    {{"--hostfile"}, 1, OPT_HOSTFILE},
    {{"--rsh"}, 1, OPT_RSH},
    {{"--rendezvous"}, 1, OPT_RENDEZVOUS},
    {{"--timeout"}, 1, OPT_TIMEOUT},
    {{"-x"}, 1, OPT_EXPORT},
    {{"--job"}, 1, OPT_JOB},
    {{"--tag-output"}, 0, OPT_TAG},
    {{"--no-tag-output"}, 0, OPT_NO_TAG},
    {{"-v", "--verbose"}, 0, OPT_VERBOSE},
    {{"-h", "--help"}, 0, OPT_HELP},
    {{"--version"}, 0, OPT_VERSION},
};

static int usage_error(hooprun_job *job, const char *fmt, ...) HOOP__PRINTF(2, 3);
static int usage_error(hooprun_job *job, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  say_va(job, fmt, ap);
  va_end(ap);
  say(job, "try 'hooprun --help' for more information");
  return -1;
}

/* The table entry that arg spells, or -1. "--name=value" also puts value in *inline_value. */
static int find_option(const char *arg, const char **inline_value) {
  *inline_value = NULL;
  for (size_t i = 0; i < sizeof option_table / sizeof option_table[0]; i++) {
    for (int k = 0; k < 3 && option_table[i].names[k]; k++) {
      const char *name = option_table[i].names[k];
      size_t len = strlen(name);
      if (strncmp(arg, name, len) != 0)
        continue;
      if (arg[len] == '\0')
        return (int)i;
      if (arg[len] == '=' && name[1] == '-' && option_table[i].takes_value) {
        *inline_value = arg + len + 1;
        return (int)i;
      }
    }
  }
  return -1;
}

static int add_export(hooprun_job *job, const char *spec) {
  hooprun_options *options = &job->options;
  if (spec[0] == '\0' || spec[0] == '=')
    return usage_error(job, "-x: '%s' does not start with a variable name", spec);
  if (!strchr(spec, '=') && !getenv(spec)) {
    say(job, "-x %s: not set in hooprun's environment; ignored", spec);
    return 0;
  }
  options->exports = xrealloc(options->exports, (size_t)(options->nexports + 1) * sizeof(char *));
  options->exports[options->nexports++] = spec;
  return 0;
}

/* ---- hosts ---------------------------------------------------------------------------------- */

/* This machine under a name a user would list: localhost, a loopback literal, or its host name
 * (whole or up to the first dot). Ranks on it are started without the remote shell. */
static int is_local_host(const char *name) {
  char self[256] = "";
  if (strcmp(name, "localhost") == 0 || strncmp(name, "127.", 4) == 0 || strcmp(name, "::1") == 0)
    return 1;
  if (gethostname(self, sizeof self - 1) != 0 || !self[0])
    return 0;
  size_t short_len = strcspn(self, ".");
  return strcmp(name, self) == 0 ||
         (strlen(name) == short_len && strncmp(name, self, short_len) == 0);
}

static int add_host(hooprun_job *job, const char *name, size_t len, long slots) {
  hooprun_options *options = &job->options;
  if (len == 0 || len > HOOP_WIRE_MAX_HOST)
    return usage_error(job, "a host name must have 1 to %d bytes", HOOP_WIRE_MAX_HOST);
  options->hosts = xrealloc(options->hosts, (size_t)(options->nhosts + 1) * sizeof *options->hosts);
  hooprun_host *host = &options->hosts[options->nhosts++];
  host->name = xrealloc(NULL, len + 1);
  memcpy(host->name, name, len);
  host->name[len] = '\0';
  host->slots = (int)slots;
  host->local = is_local_host(host->name);
  return 0;
}

/* -H host[:slots],...; an IPv6 literal goes in brackets: [fd00::1]:2. */
static int parse_host_list(hooprun_job *job, const char *list) {
  while (*list) {
    size_t len = strcspn(list, ",");
    const char *start = list, *item = list, *end = list + len, *colon = NULL;
    list = *end ? end + 1 : end;
    if (len == 0)
      continue;
    const char *name_end = end;
    if (item[0] == '[') {
      const char *close = memchr(item, ']', len);
      if (!close)
        return usage_error(job, "-H: '%.*s' has no closing ']'", (int)len, item);
      item++;
      name_end = close;
      colon = close + 1 < end && close[1] == ':' ? close + 1 : NULL;
    } else {
      colon = memchr(item, ':', len);
      if (colon)
        name_end = colon;
    }
    long slots = 1;
    if (colon) {
      char number[16];
      size_t digits = (size_t)(end - colon - 1);
      snprintf(number, sizeof number, "%.*s", (int)(digits < 15 ? digits : 15), colon + 1);
      if (digits >= 15 || hoop__parse_int(number, 1, HOOP_WIRE_MAX_RANKS, &slots) != 0)
        return usage_error(job, "-H: '%.*s' does not end in :SLOTS (1 to %d)", (int)len, start,
                           HOOP_WIRE_MAX_RANKS);
    }
    if (add_host(job, item, (size_t)(name_end - item), slots) != 0)
      return -1;
  }
  return 0;
}

/* One line of a host file: "host", or "host slots=N"; the caller has cut comments off. */
static int parse_host_line(hooprun_job *job, const char *path, int lineno, char *line) {
  char *save = NULL;
  char *name = strtok_r(line, " \t\r\n", &save);
  if (!name)
    return 0;
  long slots = 1;
  for (char *word; (word = strtok_r(NULL, " \t\r\n", &save)) != NULL;) {
    if (strncmp(word, "slots=", 6) != 0 ||
        hoop__parse_int(word + 6, 1, HOOP_WIRE_MAX_RANKS, &slots) != 0)
      return usage_error(job, "%s:%d: '%s' is not slots=N (1 to %d)", path, lineno, word,
                         HOOP_WIRE_MAX_RANKS);
  }
  return add_host(job, name, strlen(name), slots);
}

static int read_hostfile(hooprun_job *job, const char *path) {
  FILE *file = fopen(path, "r");
  if (!file)
    return usage_error(job, "--hostfile: cannot open '%s': %s", path, strerror(errno));
  char line[1024];
  int lineno = 0, rc = 0, before = job->options.nhosts;
  while (rc == 0 && fgets(line, sizeof line, file)) {
    lineno++;
    line[strcspn(line, "#")] = '\0';
    rc = parse_host_line(job, path, lineno, line);
  }
  if (rc == 0 && ferror(file))
    rc = usage_error(job, "--hostfile: reading '%s': %s", path, strerror(errno));
  fclose(file);
  if (rc == 0 && job->options.nhosts == before)
    rc = usage_error(job, "--hostfile: '%s' lists no host", path);
  return rc;
}

/* Returns 0, 1 if hooprun is done (--help, --version), or -1 after a usage error. */
static int apply_option(hooprun_job *job, option_id id, const char *value) {
  hooprun_options *options = &job->options;
  long np;
  double seconds;
  switch (id) {
  case OPT_NP:
    if (hoop__parse_int(value, 1, HOOP_WIRE_MAX_RANKS, &np) != 0)
      return usage_error(job, "-np: '%s' is not a number of ranks from 1 to %d", value,
                         HOOP_WIRE_MAX_RANKS);
    options->np = (int)np;
    return 0;
  case OPT_HOSTS: return parse_host_list(job, value);
  case OPT_HOSTFILE: return read_hostfile(job, value);
  case OPT_RSH:
    if (strspn(value, " \t") == strlen(value))
      return usage_error(job, "--rsh: the command is empty");
    options->rsh = value;
    return 0;
  case OPT_RENDEZVOUS: {
    char host[HOOP_WIRE_MAX_HOST + 1];
    int port;
    if (hoop__split_hostport(value, host, sizeof host, &port) != 0 || port == 0 || !host[0])
      return usage_error(job, "--rendezvous: '%s' is not host:port or [v6]:port", value);
    options->rendezvous = value;
    return 0;
  }
  case OPT_TIMEOUT:
    if (hoop__parse_double(value, 0.001, 1e7, &seconds) != 0)
      return usage_error(job, "--timeout: '%s' is not a number of seconds (0.001 to 1e7)", value);
    options->timeout = value;
    return 0;
  case OPT_EXPORT: return add_export(job, value);
  case OPT_JOB:
    if (value[0] == '\0' || strlen(value) > HOOP_WIRE_MAX_JOB)
      return usage_error(job, "--job: the id must have 1 to %d bytes", HOOP_WIRE_MAX_JOB);
    options->job_id = value;
    return 0;
  case OPT_TAG:
  case OPT_NO_TAG: options->tag_output = id == OPT_TAG; return 0;
  case OPT_VERBOSE: options->verbose = 1; return 0;
  case OPT_HELP: sink_write(job, &job->stdout_sink, help_text, strlen(help_text)); return 1;
  case OPT_VERSION:
    sink_write(job, &job->stdout_sink, "hooprun (hoop) " PACKAGE_VERSION "\n",
               strlen("hooprun (hoop) " PACKAGE_VERSION "\n"));
    return 1;
  }
  return 0;
}

/* Returns 0 to run the job, 1 if hooprun is done, or -1 after a usage error. */
static int parse_options(hooprun_job *job, int argc, char **argv) {
  job->options.tag_output = 1;
  int i = 1;
  for (; i < argc; i++) {
    const char *arg = argv[i];
    if (strcmp(arg, "--") == 0) {
      i++;
      break;
    }
    if (arg[0] != '-' || arg[1] == '\0')
      break;
    const char *value;
    int found = find_option(arg, &value);
    if (found < 0)
      return usage_error(job, "unknown option '%s'", arg);
    if (option_table[found].takes_value && !value) {
      if (i + 1 >= argc)
        return usage_error(job, "%s needs a value", arg);
      value = argv[++i];
    }
    int rc = apply_option(job, option_table[found].id, value);
    if (rc != 0)
      return rc;
  }
  int slots = 0;
  for (int h = 0; h < job->options.nhosts && slots <= HOOP_WIRE_MAX_RANKS; h++)
    slots += job->options.hosts[h].slots;
  if (job->options.np == 0 && job->options.nhosts > 0)
    job->options.np = slots < HOOP_WIRE_MAX_RANKS ? slots : HOOP_WIRE_MAX_RANKS;
  if (job->options.np == 0)
    return usage_error(job, "give the number of ranks with -np N");
  if (job->options.nhosts > 0 && job->options.np > slots)
    return usage_error(job, "-np %d is more than the %d slot%s of the hosts listed",
                       job->options.np, slots, slots == 1 ? "" : "s");
  if (i >= argc)
    return usage_error(job, "no program to run");
  job->options.command = argv + i;
  return 0;
}

/* ---- a rank's environment ------------------------------------------------------------------- */

/* An environment being built: owned "NAME=value" strings, ending with NULL. */
typedef struct hooprun_env {
  char **entries;
  size_t count;
} hooprun_env;

/* 1 if entry's name (up to its '=') is the name that other starts with, followed by '='. */
static int same_name(const char *entry, const char *other) {
  size_t len = strcspn(entry, "=");
  return strncmp(entry, other, len) == 0 && other[len] == '=';
}

/* Takes entry; it replaces an entry of the same name. */
static void env_add(hooprun_env *env, char *entry) {
  for (size_t i = 0; i < env->count; i++) {
    if (same_name(env->entries[i], entry)) {
      free(env->entries[i]);
      env->entries[i] = entry;
      return;
    }
  }
  env->entries = xrealloc(env->entries, (env->count + 2) * sizeof *env->entries);
  env->entries[env->count++] = entry;
  env->entries[env->count] = NULL;
}

/* Takes word and appends it, whatever its name: for lists of words rather than settings. */
static void env_add_word(hooprun_env *env, char *word) {
  env->entries = xrealloc(env->entries, (env->count + 2) * sizeof *env->entries);
  env->entries[env->count++] = word;
  env->entries[env->count] = NULL;
}

static void env_format(hooprun_env *env, const char *fmt, ...) HOOP__PRINTF(2, 3);
static void env_format(hooprun_env *env, const char *fmt, ...) {
  hooprun_text entry = {0};
  va_list ap;
  va_start(ap, fmt);
  text_vprintf(&entry, fmt, ap);
  va_end(ap);
  env_add(env, entry.data);
}

static void env_free(char **entries) {
  for (char **entry = entries; *entry; entry++)
    free(*entry);
  free(entries);
}

/* The -x settings, then the job's HOOP_ variables, which win: what a rank on another host gets
 * on its command line, on top of what its remote shell gives it. */
static void rank_settings(const hooprun_job *job, const hooprun_rank *rank, hooprun_env *env_out) {
  const hooprun_options *options = &job->options;
  hooprun_env env = *env_out;
  for (int i = 0; i < options->nexports; i++) {
    const char *spec = options->exports[i];
    const char *value;
    if (strchr(spec, '='))
      env_add(&env, xstrdup(spec));
    else if ((value = getenv(spec)) != NULL)
      env_format(&env, "%s=%s", spec, value);
  }
  env_format(&env, "HOOP_RENDEZVOUS=%s", job->rendezvous);
  env_format(&env, "HOOP_JOB=%s", job->id);
  env_format(&env, "HOOP_SIZE=%d", options->np);
  env_format(&env, "HOOP_RANK=%d", rank->index);
  if (options->timeout)
    env_format(&env, "HOOP_TIMEOUT=%s", options->timeout);
  /* Ranks on one host of the list share its name: hosts that are network namespaces or containers
   * of one machine share a kernel host name, and the rendezvous groups local ranks by name. */
  if (rank->host)
    env_format(&env, "HOOP_HOSTNAME=%s", rank->host->name);
  *env_out = env;
}

/* hooprun's environment, then rank_settings. A rank on another host starts from what its
 * remote shell gives it instead, with rank_settings on the command line. */
static char **rank_environment(const hooprun_job *job, const hooprun_rank *rank) {
  hooprun_env env = {0};
  int remote = rank->host && !rank->host->local;
  for (char **entry = environ; *entry; entry++) {
    /* A rank told to host the rendezvous would compete with hooprun's server for its port; the
     * token the job uses is set below, or for a remote rank sent through its stdin. */
    if (!same_name(*entry, "HOOP_RDZV_SERVE=") &&
        !(job->token[0] &&
          (same_name(*entry, "HOOP_TOKEN=") || same_name(*entry, "HOOP_TOKEN_FILE="))))
      env_add(&env, xstrdup(*entry));
  }
  if (job->token[0] && !remote)
    env_format(&env, "HOOP_TOKEN=%s", job->token);
  rank_settings(job, rank, &env); /* never empty: it holds the HOOP_ variables */
  return env.entries;
}

/* ---- a rank's command line ------------------------------------------------------------------ */

/* ssh and rsh join their arguments into one line for the remote shell, so each word is quoted for
 * it; other commands (`ip netns exec`, `docker exec`) take the words as they are. */
static int rsh_uses_shell(const char *rsh) {
  size_t len = strcspn(rsh, " \t");
  const char *base = rsh;
  for (const char *c = rsh; c < rsh + len; c++)
    if (*c == '/')
      base = c + 1;
  size_t base_len = (size_t)(rsh + len - base);
  return (base_len == 3 && (strncmp(base, "ssh", 3) == 0 || strncmp(base, "rsh", 3) == 0));
}

/* word in single quotes for a POSIX shell, unless it needs none. */
static char *shell_quote(const char *word) {
  if (word[0] && strspn(word, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
                              "_-+=.,:/@%") == strlen(word))
    return xstrdup(word);
  hooprun_text quoted = {0};
  text_append(&quoted, "'", 1);
  for (const char *c = word; *c; c++) {
    if (*c == '\'')
      text_append(&quoted, "'\\''", 4);
    else
      text_append(&quoted, c, 1);
  }
  text_append(&quoted, "'", 1);
  return quoted.data;
}

/* The words to start a rank: prog and its arguments on this host; elsewhere
 * RSH... HOST env SETTINGS... prog args..., where RSH is --rsh split at blanks. */
static char **rank_command(const hooprun_job *job, const hooprun_rank *rank) {
  const hooprun_options *options = &job->options;
  hooprun_env words = {0};
  if (rank->host && !rank->host->local) {
    const char *rsh = options->rsh ? options->rsh : "ssh";
    int quote = rsh_uses_shell(rsh);
    for (const char *c = rsh; *c;) {
      size_t len = strcspn(c, " \t");
      if (len > 0) {
        char *word = xrealloc(NULL, len + 1);
        memcpy(word, c, len);
        word[len] = '\0';
        env_add_word(&words, word);
      }
      c += len + strspn(c + len, " \t");
    }
    env_add_word(&words, xstrdup(rank->host->name));
    env_add_word(&words, xstrdup("env"));
    hooprun_env settings = {0};
    rank_settings(job, rank, &settings);
    for (size_t i = 0; i < settings.count; i++)
      env_add_word(&words, quote ? shell_quote(settings.entries[i]) : xstrdup(settings.entries[i]));
    if (settings.entries)
      env_free(settings.entries);
    /* The token would show in `ps` on a command line: the rank reads it from its stdin. */
    if (job->token[0]) {
      const char *script = "IFS= read -r HOOP_TOKEN && export HOOP_TOKEN && exec \"$0\" \"$@\"";
      env_add_word(&words, xstrdup("sh"));
      env_add_word(&words, xstrdup("-c"));
      env_add_word(&words, quote ? shell_quote(script) : xstrdup(script));
    }
    for (char **arg = options->command; *arg; arg++)
      env_add_word(&words, quote ? shell_quote(*arg) : xstrdup(*arg));
  } else {
    for (char **arg = options->command; *arg; arg++)
      env_add_word(&words, xstrdup(*arg));
  }
  return words.entries;
}

/* ---- forwarding the ranks' output ----------------------------------------------------------- */

static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  hooprun_output *output = handle->data;
  /* One buffer serves every pipe: each read is forwarded before the next one starts. */
  *buf = uv_buf_init(output->rank->job->read_buf, READ_BYTES);
}

/* Add one line to job->lines: the tag, the partial line kept so far, then rest (ending in '\n'). */
static void line_add(hooprun_job *job, hooprun_output *output, const char *rest, size_t len) {
  text_append(&job->lines, output->rank->tag, strlen(output->rank->tag));
  text_append(&job->lines, output->partial.data, output->partial.len);
  text_append(&job->lines, rest, len);
  output->partial.len = 0;
}

/* Forward the whole lines in data with one write; keep the unfinished rest for later. */
static void output_forward(hooprun_job *job, hooprun_output *output, const char *data, size_t len) {
  const char *end = data + len;
  const char *newline;
  job->lines.len = 0;
  while ((newline = memchr(data, '\n', (size_t)(end - data))) != NULL) {
    line_add(job, output, data, (size_t)(newline + 1 - data));
    data = newline + 1;
  }
  text_append(&output->partial, data, (size_t)(end - data));
  if (output->partial.len >= LINE_MAX_BYTES)
    line_add(job, output, "\n", 1);
  sink_write(job, output->sink, job->lines.data, job->lines.len);
}

static void on_output_closed(uv_handle_t *handle) {
  hooprun_output *output = handle->data;
  hooprun_job *job = output->rank->job;
  job->outputs_open--;
  job_progress(job);
}

/* The write end is closed, or given up on: forward the last line even without its newline. */
static void output_close(hooprun_job *job, hooprun_output *output) {
  job->lines.len = 0;
  if (output->partial.len > 0)
    line_add(job, output, "\n", 1);
  sink_write(job, output->sink, job->lines.data, job->lines.len);
  text_free(&output->partial);
  output->open = 0;
  uv_close((uv_handle_t *)&output->pipe, on_output_closed);
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
  hooprun_output *output = stream->data;
  hooprun_job *job = output->rank->job;
  if (nread > 0) {
    output_forward(job, output, buf->base, (size_t)nread);
  } else if (nread < 0) {
    if (nread != UV_EOF)
      say(job, "reading rank %d's %s: %s", output->rank->index, output->name,
          error_text((int)nread));
    output_close(job, output);
  }
}

static void output_start(hooprun_job *job, hooprun_output *output) {
  int err = uv_read_start((uv_stream_t *)&output->pipe, on_alloc, on_read);
  if (err != 0) {
    say(job, "cannot read rank %d's %s: %s", output->rank->index, output->name, error_text(err));
    job_stop(job, EXIT_FAILURE);
    return;
  }
  output->open = 1;
  job->outputs_open++;
}

/* Forward what a rank that has just exited left in its pipe, so that its last lines come out
 * before hooprun reports its exit. Stops at an empty pipe: a process the rank started may still
 * hold the write end, and the loop keeps reading that. */
static void output_read_now(hooprun_job *job, hooprun_output *output) {
  uv_os_fd_t fd;
  if (!output->open || uv_fileno((uv_handle_t *)&output->pipe, &fd) != 0)
    return;
  for (int reads = 0; reads < EXIT_READS; reads++) {
    ssize_t nread = read(fd, job->read_buf, READ_BYTES);
    if (nread > 0) {
      output_forward(job, output, job->read_buf, (size_t)nread);
      continue;
    }
    if (nread < 0 && errno == EINTR)
      continue;
    if (nread < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    if (nread < 0)
      say(job, "reading rank %d's %s: %s", output->rank->index, output->name, strerror(errno));
    output_close(job, output);
    return;
  }
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
      close_fd(job, fds[0]);
      close_fd(job, fds[1]);
    }
  }
  if (err != 0) {
    say(job, "cannot make a pipe for rank %d's %s: %s", output->rank->index, output->name,
        error_text(err));
    return -1;
  }
  output->pipe.data = output;
  *write_fd = fds[1];
  return 0;
}

static void on_rank_exit(uv_process_t *process, int64_t exit_status, int term_signal);

/* A pipe holding the token and a newline, its write end already closed: the read end becomes a
 * remote rank's stdin. The token is far below a pipe's capacity, so the write cannot block. */
static int token_pipe(hooprun_job *job) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    say(job, "cannot make a pipe for the token: %s", strerror(errno));
    return -1;
  }
  size_t len = strlen(job->token);
  char line[HOOP_MAX_TOKEN + 2];
  memcpy(line, job->token, len);
  line[len] = '\n';
  ssize_t n = write(fds[1], line, len + 1);
  hoop__auth_wipe(line, sizeof line);
  close(fds[1]);
  if (n != (ssize_t)(len + 1)) {
    say(job, "cannot write the token into its pipe: %s", n < 0 ? strerror(errno) : "short write");
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
    close_fd(job, out_fd);
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
      close_fd(job, out_fd);
      close_fd(job, err_fd);
      return EXIT_FAILURE;
    }
    stdio[0] = (uv_stdio_container_t){.flags = UV_INHERIT_FD, .data.fd = token_fd};
  }
  char **env = rank_environment(job, rank);
  char **command = rank_command(job, rank);
  uv_process_options_t spawn = {.exit_cb = on_rank_exit,
                                .file = command[0],
                                .args = command,
                                .env = env,
                                .stdio_count = 3,
                                .stdio = stdio};
  rank->process.data = rank;
  int err = uv_spawn(&job->loop, &rank->process, &spawn);
  env_free(env);
  /* Only the rank may hold the write ends, or the pipes would never reach their end. */
  close_fd(job, out_fd);
  close_fd(job, err_fd);
  if (token_fd >= 0)
    close_fd(job, token_fd);
  if (err != 0) {
    say(job, "cannot start '%s': %s", command[0], error_text(err));
    env_free(command);
    return EXIT_CANNOT_START;
  }
  rank->pid = rank->process.pid;
  rank->running = 1;
  job->running++;
  if (rank->host && !rank->host->local)
    verbose(job, "rank %d started on %s as pid %d: %s %s ...", rank->index, rank->host->name,
            rank->pid, command[0], command[1] ? command[1] : "");
  else
    verbose(job, "rank %d started as pid %d", rank->index, rank->pid);
  env_free(command);
  output_start(job, &rank->out);
  output_start(job, &rank->err);
  return 0;
}

static void start_ranks(hooprun_job *job) {
  verbose(job, "starting %d rank%s of '%s'", job->options.np, job->options.np == 1 ? "" : "s",
          job->options.command[0]);
  for (int i = 0; i < job->options.np; i++) {
    int status = spawn_rank(job, &job->ranks[i]);
    if (status != 0) {
      job_stop(job, status);
      break;
    }
  }
  job_progress(job);
}

/* ---- ranks that exit ------------------------------------------------------------------------ */

/* "exited with status 3" or "was killed by signal 9 (Killed)". */
static void describe_exit(hooprun_text *text, int64_t exit_status, int term_signal) {
  if (term_signal)
    text_printf(text, "was killed by signal %d (%s)", term_signal, strsignal(term_signal));
  else
    text_printf(text, "exited with status %d", (int)exit_status);
}

/* "rank 3 (pid 812)", or "rank 3 on node2 (pid 812)" where the pid is the remote shell's; a rank
 * on another host reports its exit through its remote shell, as ssh and `ip netns exec` do. */
static void describe_rank(hooprun_text *text, const hooprun_rank *rank) {
  if (rank->host && !rank->host->local)
    text_printf(text, "rank %d on %s (pid %d)", rank->index, rank->host->name, rank->pid);
  else
    text_printf(text, "rank %d (pid %d)", rank->index, rank->pid);
}

/* The first rank to fail is the cause, and the job stops; what exits after that was stopped. */
static void report_exit(hooprun_job *job, hooprun_rank *rank, int64_t exit_status,
                        int term_signal) {
  int status = term_signal ? 128 + term_signal : (int)exit_status;
  hooprun_text how = {0};
  describe_rank(&how, rank);
  text_append(&how, " ", 1);
  describe_exit(&how, exit_status, term_signal);
  if (job->stopping) {
    verbose(job, "%s: stopped by hooprun", how.data);
  } else if (status != 0) {
    say(job, "%s", how.data);
    job_stop(job, status);
  } else {
    verbose(job, "%s", how.data);
  }
  text_free(&how);
}

static void on_rank_exit(uv_process_t *process, int64_t exit_status, int term_signal) {
  hooprun_rank *rank = process->data;
  hooprun_job *job = rank->job;
  rank->running = 0;
  job->running--;
  output_read_now(job, &rank->out);
  output_read_now(job, &rank->err);
  report_exit(job, rank, exit_status, term_signal);
  job_progress(job);
}

/* ---- stopping and finishing the job -------------------------------------------------------- */

static void signal_ranks(hooprun_job *job, int signum) {
  for (int i = 0; i < job->options.np; i++) {
    hooprun_rank *rank = &job->ranks[i];
    if (!rank->running)
      continue;
    int err = uv_process_kill(&rank->process, signum);
    /* ESRCH: it has just exited, and its exit is on the way. */
    if (err != 0 && err != UV_ESRCH)
      say(job, "cannot signal rank %d (pid %d): %s", rank->index, rank->pid, error_text(err));
  }
}

static void on_grace_over(uv_timer_t *timer) {
  hooprun_job *job = timer->data;
  verbose(job, "%d rank%s still running %d s after SIGTERM; sending SIGKILL", job->running,
          job->running == 1 ? "" : "s", GRACE_MS / 1000);
  signal_ranks(job, SIGKILL);
}

/* Stop the job, which then ends with exit_code; only the first cause counts. */
static void job_stop(hooprun_job *job, int exit_code) {
  if (job->stopping)
    return;
  job->stopping = 1;
  job->exit_code = exit_code;
  if (job->running == 0)
    return;
  verbose(job, "stopping %d running rank%s with SIGTERM", job->running,
          job->running == 1 ? "" : "s");
  signal_ranks(job, SIGTERM);
  uv_timer_start(&job->grace_timer, on_grace_over, GRACE_MS, 0);
}

static void on_drain_over(uv_timer_t *timer) {
  hooprun_job *job = timer->data;
  for (int i = 0; i < job->options.np; i++) {
    hooprun_output *outputs[2] = {&job->ranks[i].out, &job->ranks[i].err};
    for (int k = 0; k < 2; k++) {
      if (!outputs[k]->open)
        continue;
      verbose(job,
              "rank %d's %s is still open %d s after the last exit (held by a process it "
              "started?); closing it",
              i, outputs[k]->name, DRAIN_MS / 1000);
      output_close(job, outputs[k]);
    }
  }
}

/* Every rank has exited and its output is out: stop what keeps the loop running, so that
 * uv_run returns and main closes what is left. */
static void job_finish(hooprun_job *job) {
  job->finished = 1;
  uv_timer_stop(&job->grace_timer);
  uv_timer_stop(&job->drain_timer);
  uv_signal_stop(&job->sigint);
  uv_signal_stop(&job->sigterm);
  if (job->server) {
    hoop__rdzv_server_close(job->server);
    job->server = NULL;
  }
}

/* Called after anything that may end the job: a rank's exit, the end of an output. */
static void job_progress(hooprun_job *job) {
  if (job->finished || job->running > 0)
    return;
  uv_timer_stop(&job->grace_timer);
  if (job->outputs_open == 0) {
    job_finish(job);
  } else if (!uv_is_active((uv_handle_t *)&job->drain_timer)) {
    /* From now, not from when this loop iteration began: forwarding output can take long. */
    uv_update_time(&job->loop);
    uv_timer_start(&job->drain_timer, on_drain_over, DRAIN_MS, 0);
  }
}

/* The ranks are in hooprun's process group, so a Ctrl-C at a terminal reaches them directly;
 * this also covers a signal sent to hooprun alone (kill, a batch system). */
static void on_signal(uv_signal_t *handle, int signum) {
  hooprun_job *job = handle->data;
  const char *name = signum == SIGINT ? "SIGINT" : "SIGTERM";
  if (job->stopping) {
    say(job, "got %s while stopping the job; killing the ranks now", name);
    signal_ranks(job, SIGKILL);
    return;
  }
  say(job, "got %s; stopping the job", name);
  job_stop(job, 128 + signum);
}

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
    say(job, "cannot make a job id: %s", error_text(err));
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

static void init_ranks(hooprun_job *job) {
  job->ranks = xrealloc(NULL, (size_t)job->options.np * sizeof *job->ranks);
  memset(job->ranks, 0, (size_t)job->options.np * sizeof *job->ranks);
  for (int i = 0; i < job->options.np; i++) {
    hooprun_rank *rank = &job->ranks[i];
    rank->job = job;
    rank->index = i;
    rank->host = host_of_rank(&job->options, i);
    if (job->options.tag_output)
      snprintf(rank->tag, sizeof rank->tag, "[%d] ", i);
    rank->out = (hooprun_output){.rank = rank, .sink = &job->stdout_sink, .name = "stdout"};
    rank->err = (hooprun_output){.rank = rank, .sink = &job->stderr_sink, .name = "stderr"};
  }
}

static int init_handles(hooprun_job *job) {
  int err;
  if ((err = uv_timer_init(&job->loop, &job->grace_timer)) != 0 ||
      (err = uv_timer_init(&job->loop, &job->drain_timer)) != 0 ||
      (err = uv_signal_init(&job->loop, &job->sigint)) != 0 ||
      (err = uv_signal_init(&job->loop, &job->sigterm)) != 0) {
    say(job, "cannot set up the event loop: %s", error_text(err));
    return -1;
  }
  job->grace_timer.data = job->drain_timer.data = job;
  job->sigint.data = job->sigterm.data = job;
  if ((err = uv_signal_start(&job->sigint, on_signal, SIGINT)) != 0 ||
      (err = uv_signal_start(&job->sigterm, on_signal, SIGTERM)) != 0) {
    say(job, "cannot catch signals: %s", error_text(err));
    return -1;
  }
  return 0;
}

static void on_rendezvous_done(void *arg) {
  hooprun_job *job = arg;
  verbose(job, "rendezvous of job %s is over", job->id);
}

static const hooprun_host *first_remote_host(const hooprun_options *options) {
  for (int h = 0; h < options->nhosts; h++)
    if (!options->hosts[h].local)
      return &options->hosts[h];
  return NULL;
}

static int is_loopback(const struct sockaddr_storage *addr) {
  if (addr->ss_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)addr)->sin_addr.s_addr) >> 24) == 127;
  return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)addr)->sin6_addr);
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
      say(job, "cannot choose the address for the rendezvous server: %s", err);
      return -1;
    }
  } else if (hoop__resolve(remote->name, 1, &toward, &toward_len, err, sizeof err) == 0 &&
             hoop__choose_local_addr(NULL, (struct sockaddr *)&toward, &local, &local_len, chosen,
                                     sizeof chosen, err, sizeof err) == 0 &&
             !is_loopback(&local)) {
    why = "the route to the first remote host";
  } else {
    why = "the first interface that is not loopback";
    if (hoop__choose_local_addr("^lo", NULL, &local, &local_len, chosen, sizeof chosen, err,
                                sizeof err) != 0) {
      say(job,
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
  verbose(job, "ranks reach the rendezvous server at %s (interface %s, from %s)", out, chosen, why);
  return local.ss_family == AF_INET6 ? 6 : 4;
}

/* A job served by hooprun gets a token of its own: 32 random bytes in hex. Nobody but its ranks
 * can join it, even on a shared machine where anyone may reach the port. */
static int fresh_token(hooprun_job *job) {
  unsigned char random[32];
  if (hoop__auth_random(random, sizeof random) != 0) {
    say(job, "cannot make the job's token: libsodium cannot start");
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
    say(job, "%s", err);
    return -1;
  }
  return 0;
}

/* A connection per rank, and some to spare for strangers: more than a server's usual number
 * only for a job that needs it. */
static int max_connections(const hooprun_job *job) {
  int want = job->options.np + OWN_FILES;
  return want > HOOP_RDZV_MAX_CONNECTIONS ? want : HOOP_RDZV_MAX_CONNECTIONS;
}

/* The embedded server: on 127.0.0.1 when every rank runs here; with other hosts, on every address
 * (the one given to the ranks may have other names here, as in rank 0's own server). */
static int start_server(hooprun_job *job) {
  char err[256], address[INET6_ADDRSTRLEN + 2] = "127.0.0.1";
  const char *listen = "127.0.0.1:0";
  const hooprun_host *remote = first_remote_host(&job->options);
  if (job->options.rendezvous) {
    snprintf(job->rendezvous, sizeof job->rendezvous, "%s", job->options.rendezvous);
    verbose(job, "ranks meet at the rendezvous server %s, job %s", job->rendezvous, job->id);
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
                                           .on_done = on_rendezvous_done,
                                           .arg = job};
  if (hoop__rdzv_server_start(&job->loop, &job->rdzv_options, &job->server, err, sizeof err) != 0) {
    job->server = NULL;
    say(job, "cannot start the rendezvous server: %s", err);
    return -1;
  }
  snprintf(job->rendezvous, sizeof job->rendezvous, "%s:%d", address,
           hoop__rdzv_server_port(job->server));
  verbose(job, "rendezvous server on %s for job %s", job->rendezvous, job->id);
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
    say(job,
        "warning: the open-file limit is %ld (its hard limit %ld), under the %ld that %d "
        "ranks want here (%d each, and hooprun's own): the job may run short; raise the hard "
        "limit (ulimit -Hn, LimitNOFILE=)",
        files, hard, want, np, per_rank);
    return 0;
  }
  say(job,
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
    job_finish(job);
  } else {
    start_ranks(job);
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
    say(job, "cannot close the event loop: %s", error_text(err));
    return -1;
  }
  return 0;
}

static int run(hooprun_job *job, int argc, char **argv) {
  int parsed = parse_options(job, argc, argv);
  if (parsed != 0)
    return parsed < 0 ? EXIT_USAGE : job->stdout_sink.broken ? EXIT_FAILURE : EXIT_SUCCESS;
  hoop__log_set_prefix("hooprun");
  /* A reader of our output that goes away must not kill hooprun before it stops the ranks. */
  if (signal(SIGPIPE, SIG_IGN) == SIG_ERR) {
    say(job, "cannot ignore SIGPIPE: %s", strerror(errno));
    return EXIT_FAILURE;
  }
  int err = uv_loop_init(&job->loop);
  if (err != 0) {
    say(job, "cannot make an event loop: %s", error_text(err));
    return EXIT_FAILURE;
  }
  job_run(job);
  if (loop_close(job) != 0)
    return EXIT_FAILURE;
  verbose(job, "exit status %d", job->exit_code);
  return job->exit_code;
}

int main(int argc, char **argv) {
  hooprun_job *job = xrealloc(NULL, sizeof *job);
  memset(job, 0, sizeof *job);
  job->stdout_sink = (hooprun_sink){.fd = STDOUT_FILENO, .name = "standard output"};
  job->stderr_sink = (hooprun_sink){.fd = STDERR_FILENO, .name = "standard error"};
  int status = run(job, argc, argv);
  free(job->ranks);
  for (int h = 0; h < job->options.nhosts; h++)
    free(job->options.hosts[h].name);
  free(job->options.hosts);
  free(job->options.exports);
  text_free(&job->lines);
  hoop__auth_wipe(job->token, sizeof job->token);
  free(job);
  return status;
}
