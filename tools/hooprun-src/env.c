/* env.c - what a rank starts with: its environment (hooprun's, -x and the HOOP_ variables) and
 * its command line, with the remote shell and the settings in front for a rank on another host. */
#include "config.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "hooprun.h"

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
  env->entries = hooprun_xrealloc(env->entries, (env->count + 2) * sizeof *env->entries);
  env->entries[env->count++] = entry;
  env->entries[env->count] = NULL;
}

/* Takes word and appends it, whatever its name: for lists of words rather than settings. */
static void env_add_word(hooprun_env *env, char *word) {
  env->entries = hooprun_xrealloc(env->entries, (env->count + 2) * sizeof *env->entries);
  env->entries[env->count++] = word;
  env->entries[env->count] = NULL;
}

static void env_format(hooprun_env *env, const char *fmt, ...) HOOP__PRINTF(2, 3);
static void env_format(hooprun_env *env, const char *fmt, ...) {
  hooprun_text entry = {0};
  va_list ap;
  va_start(ap, fmt);
  hooprun_text_vprintf(&entry, fmt, ap);
  va_end(ap);
  env_add(env, entry.data);
}

void hooprun_env_free(char **entries) {
  for (char **entry = entries; *entry; entry++)
    free(*entry);
  free(entries);
}

/* ---- what PyTorch programs expect (torchrun's variables) ------------------------------------ */

/* Whether the user gave name: in hooprun's environment, or with -x. */
static int user_set(const hooprun_options *options, const char *name) {
  if (getenv(name))
    return 1;
  size_t len = strlen(name);
  for (int i = 0; i < options->nexports; i++)
    if (strncmp(options->exports[i], name, len) == 0 &&
        (options->exports[i][len] == '=' || options->exports[i][len] == '\0'))
      return 1;
  return 0;
}

/* A port free on this host now, for rank 0's store (PyTorch binds it; the race with another
 * program is torchrun's too). 29500, torchrun's default, if none can be had. */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0), port = 29500;
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
  socklen_t len = sizeof addr;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&addr, sizeof addr) == 0 &&
      getsockname(fd, (struct sockaddr *)&addr, &len) == 0)
    port = ntohs(addr.sin_port);
  if (fd >= 0)
    close(fd);
  return port;
}

void hooprun_env_prepare(hooprun_job *job) {
  if (!job->master_port && !user_set(&job->options, "MASTER_PORT"))
    job->master_port = free_port();
}

/* torchrun's variables, unless the user set them: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
 * MASTER_ADDR (rank 0's host) and MASTER_PORT for torch.distributed's env:// rendezvous, and
 * OMP_NUM_THREADS=1 when several ranks share a host, so that each rank's intra-op threads do not
 * fight the others' for its cores. The same program then runs with backend "gloo" or "hoop". */
static void torch_settings(const hooprun_job *job, const hooprun_rank *rank, hooprun_env *env) {
  const hooprun_options *options = &job->options;
  int local_rank = rank->local_rank, local_size = rank->local_size;
  const struct {
    const char *name;
    long value;
  } numbers[] = {{"RANK", rank->index},
                 {"WORLD_SIZE", options->np},
                 {"LOCAL_RANK", local_rank},
                 {"LOCAL_WORLD_SIZE", local_size}};
  for (size_t i = 0; i < sizeof numbers / sizeof numbers[0]; i++)
    if (!user_set(options, numbers[i].name))
      env_format(env, "%s=%ld", numbers[i].name, numbers[i].value);
  if (!user_set(options, "MASTER_ADDR")) {
    /* Rank 0's host: loopback for ranks beside it; for the others its name in the host list, or,
     * when it is this host, the address hooprun gives every rank for its own server. */
    const hooprun_host *first = job->ranks[0].host;
    int zero_here = !first || first->local, rank_here = !rank->host || rank->host->local;
    if (zero_here && rank_here) {
      env_format(env, "MASTER_ADDR=127.0.0.1");
    } else if (zero_here && job->server) {
      const char *colon = strrchr(job->rendezvous, ':');
      int len = colon ? (int)(colon - job->rendezvous) : (int)strlen(job->rendezvous);
      const char *host = job->rendezvous;
      if (len >= 2 && host[0] == '[' && host[len - 1] == ']') {
        host++;
        len -= 2;
      }
      env_format(env, "MASTER_ADDR=%.*s", len, host);
    } else {
      env_format(env, "MASTER_ADDR=%s", first ? first->name : "127.0.0.1");
    }
  }
  if (job->master_port)
    env_format(env, "MASTER_PORT=%d", job->master_port);
  if (local_size > 1 && !user_set(options, "OMP_NUM_THREADS"))
    env_format(env, "OMP_NUM_THREADS=1");
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
      env_add(&env, hooprun_xstrdup(spec));
    else if ((value = getenv(spec)) != NULL)
      env_format(&env, "%s=%s", spec, value);
  }
  env_format(&env, "HOOP_RENDEZVOUS=%s", job->rendezvous);
  env_format(&env, "HOOP_JOB=%s", job->id);
  env_format(&env, "HOOP_SIZE=%d", options->np);
  if (rank->newcomer)
    env_format(&env, "HOOP_JOIN=1"); /* the server places it in the running job */
  else
    env_format(&env, "HOOP_RANK=%d", rank->index);
  /* The ranks end when hooprun does (lib/comm/watch.c): on this machine they watch its process;
   * anywhere, the connection to its rendezvous server (not to a hoopd, which may restart). */
  env_format(&env, "HOOP_LAUNCHER=%s", job->launcher);
  if (job->server)
    env_format(&env, "HOOP_LAUNCHER_RDZV=1");
  if (options->timeout)
    env_format(&env, "HOOP_TIMEOUT=%s", options->timeout);
  /* Ranks on one host of the list share its name: hosts that are network namespaces or containers
   * of one machine share a kernel host name, and the rendezvous groups local ranks by name. */
  if (rank->host)
    env_format(&env, "HOOP_HOSTNAME=%s", rank->host->name);
  /* The CPUs this host's ranks share, where hooprun's mask (a taskset, a cpuset) holds fewer than
   * the host has online: libhoop judges whether ranks outnumber CPUs against it (core/host.c). */
  if ((!rank->host || rank->host->local) && !user_set(options, "HOOP_HOST_CPUS") &&
      CPU_COUNT(&job->allowed) < sysconf(_SC_NPROCESSORS_ONLN))
    env_format(&env, "HOOP_HOST_CPUS=%d", CPU_COUNT(&job->allowed));
  /* hooprun binds the ranks it starts itself (spawn.c); one on another host binds itself in
   * hoop_init_from_env, from that host's CPUs (lib/comm/bind.c). */
  if (options->bind != HOOP__BIND_NONE && rank->host && !rank->host->local) {
    env_format(&env, "HOOP_BIND_TO=%s", hoop__bind_name(options->bind));
    env_format(&env, "HOOP_MAP_BY=%s", hoop__map_name(options->map));
    env_format(&env, "HOOP_LOCAL_RANK=%d", rank->local_rank);
    env_format(&env, "HOOP_LOCAL_SIZE=%d", rank->local_size);
  }
  torch_settings(job, rank, &env);
  *env_out = env;
}

/* hooprun's environment, then rank_settings. A rank on another host starts from what its
 * remote shell gives it instead, with rank_settings on the command line. */
char **hooprun_rank_environment(const hooprun_job *job, const hooprun_rank *rank) {
  hooprun_env env = {0};
  int remote = rank->host && !rank->host->local;
  for (char **entry = environ; *entry; entry++) {
    /* A rank told to host the rendezvous would compete with hooprun's server for its port; the
     * token the job uses is set below, or for a remote rank sent through its stdin. */
    if (!same_name(*entry, "HOOP_RDZV_SERVE=") &&
        !(job->token[0] &&
          (same_name(*entry, "HOOP_TOKEN=") || same_name(*entry, "HOOP_TOKEN_FILE="))))
      env_add(&env, hooprun_xstrdup(*entry));
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
    return hooprun_xstrdup(word);
  hooprun_text quoted = {0};
  hooprun_text_append(&quoted, "'", 1);
  for (const char *c = word; *c; c++) {
    if (*c == '\'')
      hooprun_text_append(&quoted, "'\\''", 4);
    else
      hooprun_text_append(&quoted, c, 1);
  }
  hooprun_text_append(&quoted, "'", 1);
  return quoted.data;
}

/* The words to start a rank: prog and its arguments on this host; elsewhere
 * RSH... HOST env SETTINGS... prog args..., where RSH is --rsh split at blanks. */
char **hooprun_rank_command(const hooprun_job *job, const hooprun_rank *rank) {
  const hooprun_options *options = &job->options;
  hooprun_env words = {0};
  if (rank->host && !rank->host->local) {
    const char *rsh = options->rsh ? options->rsh : "ssh";
    int quote = rsh_uses_shell(rsh);
    for (const char *c = rsh; *c;) {
      size_t len = strcspn(c, " \t");
      if (len > 0) {
        char *word = hooprun_xrealloc(NULL, len + 1);
        memcpy(word, c, len);
        word[len] = '\0';
        env_add_word(&words, word);
      }
      c += len + strspn(c + len, " \t");
    }
    env_add_word(&words, hooprun_xstrdup(rank->host->name));
    env_add_word(&words, hooprun_xstrdup("env"));
    hooprun_env settings = {0};
    rank_settings(job, rank, &settings);
    for (size_t i = 0; i < settings.count; i++)
      env_add_word(&words,
                   quote ? shell_quote(settings.entries[i]) : hooprun_xstrdup(settings.entries[i]));
    if (settings.entries)
      hooprun_env_free(settings.entries);
    /* The token would show in `ps` on a command line: the rank reads it from its stdin. */
    if (job->token[0]) {
      const char *script = "IFS= read -r HOOP_TOKEN && export HOOP_TOKEN && exec \"$0\" \"$@\"";
      env_add_word(&words, hooprun_xstrdup("sh"));
      env_add_word(&words, hooprun_xstrdup("-c"));
      env_add_word(&words, quote ? shell_quote(script) : hooprun_xstrdup(script));
    }
    for (char **arg = options->command; *arg; arg++)
      env_add_word(&words, quote ? shell_quote(*arg) : hooprun_xstrdup(*arg));
  } else {
    for (char **arg = options->command; *arg; arg++)
      env_add_word(&words, hooprun_xstrdup(*arg));
  }
  return words.entries;
}
