/* launchers.c - the configuration hoop_init_from_env reads: HOOP_ variables, or where HOOP_SIZE is
 * not set the rank, size, job and rendezvous that torchrun, Open MPI or Slurm gave the process. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/launchers.h"
#include "core/env.h"
#include "transport/transport.h"
#include "util/hash.h"

/* ---- integer variables ----------------------------------------------------------------------- */

/* name's value text as an integer in min..max into *out; the error names the variable. */
static hoop_result int_var(hoop_comm *comm, const char *name, const char *text, long min, long max,
                           int *out) {
  long value;
  if (hoop__parse_int(text, min, max, &value) != 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s='%s' is not a number in %ld..%ld", name,
                           text, min, max);
  *out = (int)value;
  return HOOP_OK;
}

/* A HOOP_ variable: unset or empty leaves *out as it is. */
static hoop_result env_int(hoop_comm *comm, const char *name, long min, long max, int *out) {
  const char *text = hoop__env_get(name);
  return text[0] ? int_var(comm, name, text, min, max, out) : HOOP_OK;
}

/* ---- other launchers' variables ------------------------------------------------------------- */

/* Where HOOP_SIZE is not set, the rank numbers may come from a launcher that does not know hoop.
 * Ranks started by torchrun are the children of torchrun, which may itself be a Slurm task, and
 * mpirun's daemons may be Slurm tasks too: the launcher nearest to the process comes first. */
typedef enum launcher_kind { LAUNCHER_TORCHRUN, LAUNCHER_OPEN_MPI, LAUNCHER_SLURM } launcher_kind;

static const struct hoop__launcher {
  launcher_kind kind;
  const char *name;
  const char *rank, *size, *local_rank;
  const char *job_prefix;
  const char *job_keys[2]; /* variables that name the job, the first one set wins */
} launchers[] = {
    {LAUNCHER_TORCHRUN,
     "torchrun",
     "RANK",
     "WORLD_SIZE",
     "LOCAL_RANK",
     "torchrun",
     {"TORCHELASTIC_RUN_ID", NULL}},
    {LAUNCHER_OPEN_MPI,
     "Open MPI",
     "OMPI_COMM_WORLD_RANK",
     "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK",
     "ompi",
     {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"}},
    {LAUNCHER_SLURM,
     "Slurm",
     "SLURM_PROCID",
     "SLURM_NTASKS",
     "SLURM_LOCALID",
     "slurm",
     {"SLURM_JOB_ID", "SLURM_JOBID"}},
};

/* A variable of someone else's, or NULL when unset or empty. */
static const char *foreign_env(const char *name) {
  const char *value = getenv(name);
  return value && value[0] ? value : NULL;
}

/* A launcher's variable: unset or empty is an error. */
static hoop_result foreign_int(hoop_comm *comm, const char *name, long min, long max, int *out) {
  const char *text = foreign_env(name);
  return int_var(comm, name, text ? text : "", min, max, out);
}

/* torchrun's variables need MASTER_ADDR as well: RANK and WORLD_SIZE alone are common names. */
static int launcher_present(const struct hoop__launcher *launcher) {
  if (!foreign_env(launcher->rank) || !foreign_env(launcher->size))
    return 0;
  return launcher->kind != LAUNCHER_TORCHRUN ||
         (foreign_env("MASTER_ADDR") && foreign_env("MASTER_PORT"));
}

/* "slurm-812.3", "ompi-762249217", "torchrun-none": the job's own id, so that jobs sharing one
 * hoopd stay apart. Slurm's step id tells apart the steps of one allocation. */
static void launcher_job_id(const struct hoop__launcher *launcher, char *job, size_t joblen) {
  const char *key = NULL;
  for (int i = 0; i < 2 && !key; i++)
    key = launcher->job_keys[i] ? foreign_env(launcher->job_keys[i]) : NULL;
  const char *step = launcher->kind == LAUNCHER_SLURM ? foreign_env("SLURM_STEP_ID") : NULL;
  snprintf(job, joblen, "%s%s%s%s%s", launcher->job_prefix, key ? "-" : "", key ? key : "",
           step ? "." : "", step ? step : "");
}

/* A port for a job's ranks to meet on when nobody named one (mpirun's on one host, Slurm's without
 * reserved ports): derived from the job id so that concurrent jobs differ, and below Linux's
 * ephemeral ports (32768 and up). */
static int job_port(const char *job) {
  return 21000 + (int)(hoop__fnv1a(job) % 8000);
}

/* ---- Slurm: rank 0's host and a port --------------------------------------------------------- */

int hoop__slurm_first_host(const char *list, char *out, size_t cap) {
  size_t len = 0;
  const char *c = list ? list : "";
  while (*c && *c != ',') {
    if (*c == ']')
      return -1;
    if (*c != '[') {
      if (len + 1 >= cap)
        return -1;
      out[len++] = *c++;
      continue;
    }
    /* A range list: its first number, as written ("[01-04,7]" gives "01"). */
    c++;
    size_t digits = 0;
    for (; *c >= '0' && *c <= '9'; c++, digits++) {
      if (len + 1 >= cap)
        return -1;
      out[len++] = *c;
    }
    if (digits == 0)
      return -1;
    while (*c && *c != ']')
      c++;
    if (*c++ != ']')
      return -1;
  }
  if (len == 0)
    return -1;
  out[len] = '\0';
  return 0;
}

/* The port of a Slurm step's rendezvous: the first of the ports Slurm reserved for the step
 * (SLURM_STEP_RESV_PORTS, where slurm.conf's MpiParams=ports=... reserves some), else one derived
 * from the job id, as for mpirun's ranks on one host. -1 when the reserved ports are malformed. */
static int slurm_port(const char *job) {
  const char *resv = foreign_env("SLURM_STEP_RESV_PORTS");
  if (!resv)
    return job_port(job);
  char *end;
  long port = strtol(resv, &end, 10);
  return port >= 1 && port <= 65535 && (*end == '\0' || *end == '-' || *end == ',') ? (int)port
                                                                                    : -1;
}

/* Slurm's ranks with no address given meet at rank 0's host, the first of the step's nodes (srun
 * places task 0 there under its block and cyclic distributions). */
static hoop_result slurm_rendezvous(hoop_comm *comm, hoop__launcher_env *found) {
  const char *names[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"};
  const char *name = NULL, *list = NULL;
  for (size_t i = 0; i < sizeof names / sizeof names[0] && !list; i++)
    list = foreign_env(name = names[i]);
  char host[HOOP__WIRE_MAX_HOST + 1];
  if (!list || hoop__slurm_first_host(list, host, sizeof host) != 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_init: Slurm started this process as rank %d of %d, but %s: set "
                           "HOOP_RENDEZVOUS=host:port (of a hoopd, or with HOOP_RDZV_SERVE=1 "
                           "for rank 0 to host it), or MASTER_ADDR and MASTER_PORT",
                           found->rank, found->size,
                           list ? "its node list is not one hoop can read"
                                : "there is no node list (SLURM_STEP_NODELIST) to find rank 0's "
                                  "host in");
  const char *node = foreign_env("SLURMD_NODENAME");
  if (found->rank == 0 && node && strcmp(node, host) != 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_init: Slurm placed rank 0 on %s, not on the first node of %s "
                           "(%s), where the other ranks look for it: set HOOP_RENDEZVOUS or "
                           "MASTER_ADDR and MASTER_PORT (or use srun's block or cyclic "
                           "distribution)",
                           node, name, host);
  int port = slurm_port(found->job);
  if (port < 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "SLURM_STEP_RESV_PORTS='%s' does not start with a port number",
                           foreign_env("SLURM_STEP_RESV_PORTS"));
  snprintf(found->rendezvous, sizeof found->rendezvous, strchr(host, ':') ? "[%s]:%d" : "%s:%d",
           host, port);
  return HOOP_OK;
}

/* The rendezvous for a launcher's ranks: HOOP_RENDEZVOUS if set (a hoopd, or rank 0 with
 * HOOP_RDZV_SERVE=1); else MASTER_ADDR and MASTER_PORT + 1, hosted by rank 0 (torchrun's own
 * store, or torch.distributed's, listens on MASTER_PORT itself); else, for mpirun ranks that all
 * run on this host, a loopback port hosted by rank 0; for Slurm's, the first node of the step. */
static hoop_result launcher_rendezvous(hoop_comm *comm, hoop__launcher_env *found,
                                       hoop_config *config) {
  const char *addr = foreign_env("MASTER_ADDR"), *port_text = foreign_env("MASTER_PORT");
  int local_size = 0;
  config->serve_rendezvous = config->serve_rendezvous && found->rank == 0;
  if (hoop__env_is_set("HOOP_RENDEZVOUS"))
    return HOOP_OK;
  if (addr && port_text) {
    int port;
    hoop_result result = foreign_int(comm, "MASTER_PORT", 1, 65534, &port);
    if (result != HOOP_OK)
      return result;
    snprintf(found->rendezvous, sizeof found->rendezvous, strchr(addr, ':') ? "[%s]:%d" : "%s:%d",
             addr, port + 1);
  } else if (found->launcher->kind == LAUNCHER_OPEN_MPI &&
             foreign_env("OMPI_COMM_WORLD_LOCAL_SIZE") &&
             foreign_int(comm, "OMPI_COMM_WORLD_LOCAL_SIZE", 1, HOOP__WIRE_MAX_RANKS,
                         &local_size) == HOOP_OK &&
             local_size == found->size) {
    snprintf(found->rendezvous, sizeof found->rendezvous, "127.0.0.1:%d", job_port(found->job));
  } else if (found->launcher->kind == LAUNCHER_SLURM && found->size > 1) {
    hoop_result result = slurm_rendezvous(comm, found);
    if (result != HOOP_OK)
      return result;
  } else {
    if (found->size > 1)
      return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                             "hoop_init: %s started this process as rank %d of %d, but there is "
                             "no rendezvous address: set HOOP_RENDEZVOUS=host:port (of a hoopd, "
                             "or with HOOP_RDZV_SERVE=1 for rank 0 to host it), or MASTER_ADDR "
                             "and MASTER_PORT",
                             found->launcher->name, found->rank, found->size);
    return HOOP_OK;
  }
  config->rendezvous = found->rendezvous;
  config->serve_rendezvous = found->rank == 0;
  return HOOP_OK;
}

/* Fill config's rank, size, job and rendezvous from the first launcher whose variables are set;
 * found->launcher stays NULL when there is none. */
static hoop_result config_from_launcher(hoop_comm *comm, hoop_config *config,
                                        hoop__launcher_env *found) {
  const struct hoop__launcher *launcher = NULL;
  for (size_t i = 0; i < sizeof launchers / sizeof launchers[0] && !launcher; i++)
    if (launcher_present(&launchers[i]))
      launcher = &launchers[i];
  if (!launcher)
    return HOOP_OK;
  found->launcher = launcher;
  found->local_rank = -1;
  hoop_result result;
  if ((result = foreign_int(comm, launcher->size, 1, HOOP__WIRE_MAX_RANKS, &found->size)) !=
          HOOP_OK ||
      (result = foreign_int(comm, launcher->rank, 0, found->size - 1, &found->rank)) != HOOP_OK ||
      (foreign_env(launcher->local_rank) &&
       (result = foreign_int(comm, launcher->local_rank, 0, found->size - 1, &found->local_rank)) !=
           HOOP_OK))
    return result;
  config->size = found->size;
  config->rank = found->rank;
  launcher_job_id(launcher, found->job, sizeof found->job);
  if (!hoop__env_is_set("HOOP_JOB"))
    config->job = found->job;
  if ((result = launcher_rendezvous(comm, found, config)) != HOOP_OK)
    return result;
  HOOP__INFO(HOOP_SUBSYS_ENV,
             "HOOP_SIZE is not set: using %s's variables: rank %d of %d, local rank %d, job '%s', "
             "rendezvous %s%s",
             launcher->name, found->rank, found->size, found->local_rank, config->job,
             config->rendezvous[0] ? config->rendezvous : "(none)",
             config->serve_rendezvous ? " (hosted by this rank)" : "");
  return HOOP_OK;
}

hoop_result hoop__config_from_env(hoop_comm *comm, hoop_config *config, hoop__launcher_env *found) {
  hoop_config_init(config);
  config->rendezvous = hoop__env_get("HOOP_RENDEZVOUS");
  config->job = hoop__env_get("HOOP_JOB");
  config->ifname = hoop__env_get("HOOP_IFNAME");
  config->transport = hoop__env_get("HOOP_TRANSPORT");
  config->token = hoop__env_is_set("HOOP_TOKEN") ? hoop__env_get("HOOP_TOKEN") : NULL;
  config->token_file =
      hoop__env_is_set("HOOP_TOKEN_FILE") ? hoop__env_get("HOOP_TOKEN_FILE") : NULL;
  config->hostname = hoop__env_is_set("HOOP_HOSTNAME") ? hoop__env_get("HOOP_HOSTNAME") : NULL;
  /* Without a launcher's variables a program runs as a job of one rank, as MPI singletons do. */
  config->size = 1;
  hoop_result result;
  if ((result = env_int(comm, "HOOP_SIZE", 1, HOOP__WIRE_MAX_RANKS, &config->size)) != HOOP_OK ||
      (result = env_int(comm, "HOOP_RANK", 0, HOOP__WIRE_MAX_RANKS - 1, &config->rank)) !=
          HOOP_OK ||
      (result = env_int(comm, "HOOP_RDZV_SERVE", 0, 1, &config->serve_rendezvous)) != HOOP_OK ||
      (result = env_int(comm, "HOOP_JOIN", 0, 1, &config->join_running)) != HOOP_OK ||
      (result = env_int(comm, "HOOP_TCP_STREAMS", 1, HOOP__MAX_STREAMS, &config->tcp_streams)) !=
          HOOP_OK)
    return result;
  const char *timeout = hoop__env_get("HOOP_TIMEOUT");
  if (hoop__parse_double(timeout, 0.001, 1e7, &config->timeout_s) != 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "HOOP_TIMEOUT='%s' is not a positive number of seconds", timeout);
  if (!hoop__env_is_set("HOOP_SIZE"))
    return config_from_launcher(comm, config, found);
  /* A Kubernetes indexed Job gives each pod its index; the pods share one template, so
   * HOOP_RDZV_SERVE=1 in it makes index 0 alone host the rendezvous. */
  const char *index = foreign_env("JOB_COMPLETION_INDEX");
  if (!hoop__env_is_set("HOOP_RANK") && index) {
    if ((result = int_var(comm, "JOB_COMPLETION_INDEX", index, 0, config->size - 1,
                          &config->rank)) != HOOP_OK)
      return result;
    config->serve_rendezvous = config->serve_rendezvous && config->rank == 0;
    HOOP__INFO(HOOP_SUBSYS_ENV, "HOOP_RANK is not set: rank %d of %d from JOB_COMPLETION_INDEX%s",
               config->rank, config->size,
               config->serve_rendezvous ? " (hosting the rendezvous)" : "");
  }
  return HOOP_OK;
}

/* The table's local rank is the one hoop_local_rank returns. */
void hoop__launcher_check_local_rank(const hoop_comm *comm, const hoop__launcher_env *found) {
  if (found->launcher && found->local_rank >= 0 && found->local_rank != comm->local_rank)
    HOOP__WARN(HOOP_SUBSYS_ENV,
               "%s says local rank %d (%s), the rendezvous says %d of %d on this host name; "
               "hoop_local_rank() returns the latter (HOOP_HOSTNAME sets the name)",
               found->launcher->name, found->local_rank, found->launcher->local_rank,
               comm->local_rank, comm->local_size);
}
