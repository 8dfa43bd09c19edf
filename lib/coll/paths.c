/* paths.c - what the dispatcher's device paths (tune.c's table of paths) decide alike: whether any
 * rank has loaded a memory kind that a path needs, asked once per communicator; a path's local
 * question asked without it becoming the call's error; how often a path asks when no rank can
 * (backing off); and the log, once at info and then at trace, of why a call goes another way. */
#include <string.h>

#include "coll/coll.h"
#include "coll/paths.h"
#include "coll/state.h"
#include "core/log.h"

/* Backing off: after agreements that found no rank able, skip up to this many calls. */
#define BACKOFF_MAX 64

int hoop__paths_kinds(hoop_comm *comm, hoop_result *result) {
  if (comm->coll->path_kinds == 0) {
    unsigned bits = hoop__mem_kinds_here();
    hoop__group whole = hoop__whole(comm);
    if ((*result = hoop__group_agree_bits(comm, &whole, &bits, 0xffu)) != HOOP_OK)
      return -1;
    comm->coll->path_kinds = bits | HOOP__PATH_KINDS_ASKED;
    if (bits)
      HOOP__INFO(HOOP_SUBSYS_COLL,
                 "paths: a rank has device memory of a kind that%s%s: large calls on device "
                 "buffers ask whether they can go a device path",
                 bits & HOOP__MEMCAP_MAP ? " its host's peers can map" : "",
                 bits & HOOP__MEMCAP_NET ? (bits & HOOP__MEMCAP_MAP ? " and the network can reach"
                                                                    : " the network can reach")
                                         : "");
    else
      HOOP__INFO(HOOP_SUBSYS_COLL, "paths: no rank loads a CUDA driver or other device memory "
                                   "kind: no call goes a device path");
  }
  return (int)(comm->coll->path_kinds & ~HOOP__PATH_KINDS_ASKED);
}

void hoop__probe_begin(hoop_comm *comm, hoop__probe *probe) {
  memcpy(probe->saved, comm->last_error, sizeof probe->saved);
}

void hoop__probe_end(hoop_comm *comm, const hoop__probe *probe, char *why, size_t whylen) {
  if (why && whylen && !why[0])
    snprintf(why, whylen, "%.200s", comm->last_error);
  memcpy(comm->last_error, probe->saved, sizeof probe->saved);
}

int hoop__path_skip(hoop__path_state *state) {
  if (state->skip <= 0)
    return 0;
  state->skip--; /* alike on every rank: each counts the same calls */
  return 1;
}

int hoop__path_back_off(hoop__path_state *state, int anyone) {
  if (anyone) {
    state->backoff = 0;
    return 0;
  }
  state->backoff = state->backoff ? 2 * state->backoff : 1;
  if (state->backoff > BACKOFF_MAX)
    state->backoff = BACKOFF_MAX;
  state->skip = state->backoff;
  return state->skip;
}

void hoop__path_tell(hoop_comm *comm, hoop__path_state *state, const char *path, size_t bytes,
                     const char *used, const char *why) {
  if (used) {
    if (!state->told_used)
      HOOP__INFO(HOOP_SUBSYS_COLL, "%s: %s of %zu bytes %s", path, comm->call, bytes, used);
    state->told_used = 1;
    return;
  }
  if (!state->told_why)
    HOOP__INFO(HOOP_SUBSYS_COLL, "%s: %s of %zu bytes is staged through host memory: %s", path,
               comm->call, bytes, why);
  else
    HOOP__TRACE(HOOP_SUBSYS_COLL, "%s: %s of %zu bytes is staged: %s", path, comm->call, bytes,
                why);
  state->told_why = 1;
}
