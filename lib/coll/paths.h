/* paths.h - the dispatcher's device paths: tune.c's table of them, what they decide alike
 * (paths.c), and the paths themselves (path_ipc.c, path_gdr.c). Only the dispatcher's files
 * include it; the algorithms never see a path. */
#ifndef HOOP__COLL_PATHS_H
#define HOOP__COLL_PATHS_H

#include "coll/coll.h"
#include "mem/kind.h"

/* The device kind's own operations (mem/kind.h), through which the paths reach device memory:
 * they name no driver function. */
static inline const hoop__device_ops *hoop__device(void) {
  return hoop__mem_cuda.device;
}

/* tune.c: run the call on the first device path of the table whose needs the job meets and that
 * takes it (1, its result in *result: an exchange failing counts too), or settle alike on every
 * rank that it goes the usual way (0). prepare is the collective's step before its algorithm
 * (NULL: none). The dispatcher calls it after choosing the algorithm, before staging. */
int hoop__coll_path(hoop_comm *comm, const hoop__coll_args *args, const hoop__algo *algo,
                    hoop__algo_fn prepare, hoop_result *result);
/* Free every path's state (hoop_finalize). */
void hoop__paths_free(hoop_comm *comm);

/* A path of tune.c's table. enabled: its settings and the call's size allow it (alike on every
 * rank, no exchange; 0 or 1, or -1 with *result on a failure); by_host: the row is the one that
 * runs host by host. run: 1 when it ran the call (its
 * result in *result), 0 when every rank declined alike. */
typedef struct hoop__path {
  int (*enabled)(hoop_comm *comm, const hoop__coll_args *args, const hoop__algo *algo, int by_host,
                 hoop_result *result);
  int (*run)(hoop_comm *comm, const hoop__coll_args *args, const hoop__algo *algo,
             hoop__algo_fn prepare, hoop_result *result);
  void (*free)(hoop_comm *comm);
  /* The smallest call it may take, as its payload per rank times the rank count (which bounds
   * every size a path measures a call by), from its settings: SIZE_MAX when it is off, 0 when it
   * cannot say (its state could not be made). */
  size_t (*floor)(hoop_comm *comm);
} hoop__path;
extern const hoop__path hoop__path_ipc; /* path_ipc.c */
extern const hoop__path hoop__path_gdr; /* path_gdr.c */

/* paths.c: what the paths decide alike. Once per communicator: the capabilities (HOOP__MEMCAP_*)
 * of the memory kinds some rank has loaded, or -1 when the exchange failed (*result). */
#define HOOP__PATH_KINDS_ASKED 0x100u
int hoop__paths_kinds(hoop_comm *comm, hoop_result *result);
/* A path's local question, asked without what it records becoming the call's error: end puts the
 * last error back, first copying it into why if why is given and still empty. */
typedef struct hoop__probe {
  char saved[sizeof((hoop_comm *)0)->last_error];
} hoop__probe;
void hoop__probe_begin(hoop_comm *comm, hoop__probe *probe);
void hoop__probe_end(hoop_comm *comm, const hoop__probe *probe, char *why, size_t whylen);
/* A path's log and back-off. skip: 1 when this call is to go the usual way without asking (after
 * agreements that found no rank able; alike on every rank, which count the same calls). back_off:
 * after an agreement, anyone: whether some rank could ever go this way; returns the calls now to
 * be skipped (0 when anyone). tell: once at info, then at trace, that the call goes this way
 * (used: how) or why not. */
typedef struct hoop__path_state {
  int skip, backoff;
  int told_why, told_used;
} hoop__path_state;
int hoop__path_skip(hoop__path_state *state);
int hoop__path_back_off(hoop__path_state *state, int anyone);
void hoop__path_tell(hoop_comm *comm, hoop__path_state *state, const char *path, size_t bytes,
                     const char *used, const char *why);

#endif /* HOOP__COLL_PATHS_H */
