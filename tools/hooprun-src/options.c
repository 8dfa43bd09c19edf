/* options.c - hooprun's command line: the options, the help text, and the hosts of -H and
 * --hostfile with the slots that ranks fill in order. */
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/env.h"
#include "hooprun.h"
#include "proto/wire.h"
#include "util/netaddr.h"

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
    "  --min-np N           elastic: a rank that fails does not stop the job while at least N\n"
    "                       ranks still run (the survivors go on, e.g. with hoop_comm_shrink);\n"
    "                       default: N = -np, every failure stops the job; ranks still\n"
    "                       running --timeout + 1 s after one finished well are stopped\n"
    "  --max-np M           with --min-np: start a replacement on the host of a rank that\n"
    "                       failed while fewer than M ranks run (at most -np replacements);\n"
    "                       it joins the running job (HOOP_JOIN=1) when the others make\n"
    "                       room for it with hoop_comm_grow\n"
    "  -x VAR               pass VAR on to the ranks (on this host they get it anyway)\n"
    "  -x VAR=VALUE         set VAR to VALUE for the ranks (not HOOP_TOKEN: see below)\n"
    "  --bind-to WHAT       bind each rank on this host to a core, its socket or NUMA node\n"
    "                       (core, socket, numa), or not at all (none, the default, as\n"
    "                       Horovod advises: a rank's data-loader workers need CPUs too);\n"
    "                       ranks on other hosts bind themselves the same way\n"
    "  --map-by WHAT        how a host's ranks spread over its cores: in order (core, the\n"
    "                       default, or slot), or a socket or NUMA node after the other\n"
    "                       (socket, numa)\n"
    "  --encrypt            seal every byte the ranks send over TCP (HOOP_ENCRYPT=1; hoop-env(7))\n"
    "  --job ID             job id (default: hooprun-<pid>-<random hex>)\n"
    "  --tag-output         prefix each line of the ranks' output with \"[rank] \" (default)\n"
    "  --no-tag-output      forward the ranks' lines as they are\n"
    "  --report S           every S seconds, say on stderr how the job runs: calls per second,\n"
    "                       time waiting, the ranks the others wait for, the slowest links\n"
    "                       (also on SIGUSR1, without --report)\n"
    "  -v, --verbose        say on stderr what hooprun does: server port, starts, exits\n"
    "  -h, --help           show this help and exit\n"
    "  --version            show the version and exit\n"
    "\n"
    "A job whose rendezvous hooprun serves gets a fresh random token (HOOP_TOKEN), so that only\n"
    "its ranks can join it; ranks on other hosts read it from their stdin, as they read the\n"
    "token of --rendezvous's hoopd.\n"
    "Ranks read stdin (rank 0 only) and inherit hooprun's environment (on other hosts: what the\n"
    "remote shell gives them, plus -x and the HOOP_ variables). With other hosts, the embedded\n"
    "server listens on every address and ranks get the one that routes to the first remote host\n"
    "(HOOP_IFNAME picks the interface instead). On a rank's failure the other ranks get 1 s to\n"
    "end on their own (reporting it), then they (or their remote shells) get SIGTERM, and SIGKILL\n"
    "3 s later; on SIGINT or SIGTERM at once; with --min-np, only once fewer than N ranks are\n"
    "left.\n"
    "\n"
    "Exit status: 0 if every rank exited with 0 (with --min-np: every rank that the job did not "
    "go\n"
    "on without); else the status of the first rank that failed\n"
    "(128+N if signal N killed it); 128+N if hooprun got signal N; 127 if prog cannot be started;\n"
    "2 for a usage error; 1 for any other error of hooprun's.\n";

typedef enum option_id {
  OPT_NP,
  OPT_HOSTS,
  OPT_HOSTFILE,
  OPT_RSH,
  OPT_RENDEZVOUS,
  OPT_TIMEOUT,
  OPT_MIN_NP,
  OPT_MAX_NP,
  OPT_EXPORT,
  OPT_JOB,
  OPT_TAG,
  OPT_NO_TAG,
  OPT_VERBOSE,
  OPT_REPORT,
  OPT_ENCRYPT,
  OPT_BIND_TO,
  OPT_MAP_BY,
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
    {{"--min-np"}, 1, OPT_MIN_NP},
    {{"--max-np"}, 1, OPT_MAX_NP},
    {{"-x"}, 1, OPT_EXPORT},
    {{"--job"}, 1, OPT_JOB},
    {{"--tag-output"}, 0, OPT_TAG},
    {{"--no-tag-output"}, 0, OPT_NO_TAG},
    {{"-v", "--verbose"}, 0, OPT_VERBOSE},
    {{"--report"}, 1, OPT_REPORT},
    {{"--encrypt"}, 0, OPT_ENCRYPT},
    {{"--bind-to"}, 1, OPT_BIND_TO},
    {{"--map-by"}, 1, OPT_MAP_BY},
    {{"-h", "--help"}, 0, OPT_HELP},
    {{"--version"}, 0, OPT_VERSION},
};

static int usage_error(hooprun_job *job, const char *fmt, ...) HOOP__PRINTF(2, 3);
static int usage_error(hooprun_job *job, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  hooprun_say_va(job, fmt, ap);
  va_end(ap);
  hooprun_say(job, "try 'hooprun --help' for more information");
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
  /* On another host a -x setting is a word of the remote shell's command line, which every user
   * there reads in ps. */
  if (strcmp(spec, "HOOP_TOKEN") == 0 || strncmp(spec, "HOOP_TOKEN=", 11) == 0)
    return usage_error(job, "-x HOOP_TOKEN: the token would show on the ranks' command lines; "
                            "set HOOP_TOKEN or HOOP_TOKEN_FILE in hooprun's own environment, and "
                            "hooprun hands it to every rank on its stdin");
  if (!strchr(spec, '=') && !getenv(spec)) {
    hooprun_say(job, "-x %s: not set in hooprun's environment; ignored", spec);
    return 0;
  }
  options->exports =
      hooprun_xrealloc(options->exports, (size_t)(options->nexports + 1) * sizeof(char *));
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
  if (len == 0 || len > HOOP__WIRE_MAX_HOST)
    return usage_error(job, "a host name must have 1 to %d bytes", HOOP__WIRE_MAX_HOST);
  /* The name becomes an argument of the remote shell (ssh HOST ...): one that starts with '-'
   * would be read as an option (-oProxyCommand=...), and spaces or control bytes have no place in
   * a host name. */
  if (name[0] == '-')
    return usage_error(job,
                       "host '%.*s' starts with '-', which the remote shell would take for an "
                       "option",
                       (int)len, name);
  for (size_t i = 0; i < len; i++)
    if ((unsigned char)name[i] <= ' ' || name[i] == 0x7f)
      return usage_error(job, "host '%.*s' holds a space or a control character", (int)len, name);
  options->hosts =
      hooprun_xrealloc(options->hosts, (size_t)(options->nhosts + 1) * sizeof *options->hosts);
  hooprun_host *host = &options->hosts[options->nhosts++];
  host->name = hooprun_xrealloc(NULL, len + 1);
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
      if (digits >= 15 || hoop__parse_int(number, 1, HOOP__WIRE_MAX_RANKS, &slots) != 0)
        return usage_error(job, "-H: '%.*s' does not end in :SLOTS (1 to %d)", (int)len, start,
                           HOOP__WIRE_MAX_RANKS);
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
        hoop__parse_int(word + 6, 1, HOOP__WIRE_MAX_RANKS, &slots) != 0)
      return usage_error(job, "%s:%d: '%s' is not slots=N (1 to %d)", path, lineno, word,
                         HOOP__WIRE_MAX_RANKS);
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
    if (hoop__parse_int(value, 1, HOOP__WIRE_MAX_RANKS, &np) != 0)
      return usage_error(job, "-np: '%s' is not a number of ranks from 1 to %d", value,
                         HOOP__WIRE_MAX_RANKS);
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
    char host[HOOP__WIRE_MAX_HOST + 1];
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
  case OPT_MIN_NP:
    if (hoop__parse_int(value, 1, HOOP__WIRE_MAX_RANKS, &np) != 0)
      return usage_error(job, "--min-np: '%s' is not a number of ranks from 1 to %d", value,
                         HOOP__WIRE_MAX_RANKS);
    options->min_np = (int)np;
    return 0;
  case OPT_MAX_NP:
    if (hoop__parse_int(value, 1, HOOP__WIRE_MAX_RANKS, &np) != 0)
      return usage_error(job, "--max-np: '%s' is not a number of ranks from 1 to %d", value,
                         HOOP__WIRE_MAX_RANKS);
    options->max_np = (int)np;
    return 0;
  case OPT_EXPORT: return add_export(job, value);
  case OPT_JOB:
    if (value[0] == '\0' || strlen(value) > HOOP__WIRE_MAX_JOB)
      return usage_error(job, "--job: the id must have 1 to %d bytes", HOOP__WIRE_MAX_JOB);
    options->job_id = value;
    return 0;
  case OPT_TAG:
  case OPT_NO_TAG: options->tag_output = id == OPT_TAG; return 0;
  case OPT_VERBOSE: options->verbose = 1; return 0;
  case OPT_REPORT:
    if (hoop__parse_double(value, 0.1, 86400, &options->report_s) != 0)
      return usage_error(job, "--report: '%s' is not a number of seconds (0.1 to 86400)", value);
    return 0;
  case OPT_ENCRYPT: return add_export(job, "HOOP_ENCRYPT=1");
  case OPT_BIND_TO:
    if (hoop__bind_parse(value, &options->bind) != 0)
      return usage_error(job, "--bind-to: '%s' is not none, core, socket or numa", value);
    return 0;
  case OPT_MAP_BY:
    if (hoop__map_parse(value, &options->map) != 0)
      return usage_error(job, "--map-by: '%s' is not core, slot, socket or numa", value);
    return 0;
  case OPT_HELP: hooprun_sink_write(job, &job->stdout_sink, help_text, strlen(help_text)); return 1;
  case OPT_VERSION:
    hooprun_sink_write(job, &job->stdout_sink, "hooprun (hoop) " PACKAGE_VERSION "\n",
                       strlen("hooprun (hoop) " PACKAGE_VERSION "\n"));
    return 1;
  }
  return 0;
}

/* Returns 0 to run the job, 1 if hooprun is done, or -1 after a usage error. */
int hooprun_parse_options(hooprun_job *job, int argc, char **argv) {
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
  for (int h = 0; h < job->options.nhosts && slots <= HOOP__WIRE_MAX_RANKS; h++)
    slots += job->options.hosts[h].slots;
  if (job->options.np == 0 && job->options.nhosts > 0)
    job->options.np = slots < HOOP__WIRE_MAX_RANKS ? slots : HOOP__WIRE_MAX_RANKS;
  if (job->options.np == 0)
    return usage_error(job, "give the number of ranks with -np N");
  if (job->options.nhosts > 0 && job->options.np > slots)
    return usage_error(job, "-np %d is more than the %d slot%s of the hosts listed",
                       job->options.np, slots, slots == 1 ? "" : "s");
  if (job->options.min_np > job->options.np)
    return usage_error(job, "--min-np %d is more than the %d rank%s of the job",
                       job->options.min_np, job->options.np, job->options.np == 1 ? "" : "s");
  if (job->options.max_np && !job->options.min_np)
    return usage_error(job, "--max-np needs --min-np: without it, a failure stops the job");
  if (job->options.max_np && job->options.max_np < job->options.np)
    return usage_error(job, "--max-np %d is less than -np %d", job->options.max_np,
                       job->options.np);
  if (i >= argc)
    return usage_error(job, "no program to run");
  job->options.command = argv + i;
  return 0;
}
