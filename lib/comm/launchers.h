/* launchers.h - a configuration from the environment: hoop's own HOOP_ variables, or, where
 * HOOP_SIZE is not set, those of a launcher that does not know hoop (torchrun, Open MPI, Slurm). */
#ifndef HOOP__LAUNCHERS_H
#define HOOP__LAUNCHERS_H

#include "core/internal.h"

struct hoop__launcher;

/* What a launcher told this process; the strings live here until hoop_init has copied them. */
typedef struct hoop__launcher_env {
  const struct hoop__launcher *launcher; /* NULL: none found */
  int rank, size, local_rank;            /* local_rank -1 when the launcher gave none */
  char rendezvous[HOOP__WIRE_MAX_HOST + 16];
  char job[HOOP__WIRE_MAX_JOB + 1];
} hoop__launcher_env;

/* Fill config from HOOP_ variables, or from the first launcher whose variables are set (found
 * says which; found->launcher stays NULL when there is none). HOOP_OK, or the error recorded on
 * comm. */
hoop_result hoop__config_from_env(hoop_comm *comm, hoop_config *config, hoop__launcher_env *found);

/* A launcher's local rank that differs from the rank table's is warned about: the hosts' names
 * group the ranks differently from the launcher (HOOP_HOSTNAME sets the name). */
void hoop__launcher_check_local_rank(const hoop_comm *comm, const hoop__launcher_env *found);

/* The first host of a Slurm host list into out: "node[01-04,7],gpu1" gives "node01" (each
 * bracket's first number as written, zero padding kept). 0, or -1 when list is empty, malformed or
 * the name does not fit in cap bytes. */
/* HOOP_BIND_TO (bind.c): every thread of this process bound to its CPUs, as hooprun --bind-to
 * binds the ranks it starts itself. HOOP_OK (also where it is unset or none), or the error
 * recorded on comm. */
hoop_result hoop__bind_from_env(hoop_comm *comm);
/* At HOOP_DEBUG=info, the CPUs this rank may run on. */
void hoop__log_cpus(void);

int hoop__slurm_first_host(const char *list, char *out, size_t cap);

#endif /* HOOP__LAUNCHERS_H */
