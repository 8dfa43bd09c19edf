/* algo.c - the tuning variables collectives obey: HOOP_CHUNK_BYTES, and HOOP_ALGO, which forces
 * one algorithm family for every call instead of the choice by size and rank count (for tests, and
 * for users whose network differs from ours). Both are read once per communicator, at its first
 * collective; a bad value fails that call and every later one, each with the same message. The
 * same first call notes whether the job is crowded onto one host (comm->crowded). */
#include <string.h>

#include "coll/coll.h"
#include "core/env.h"

hoop_result hoop__coll_tuning(hoop_comm *comm, hoop__algo *out) {
  if (comm->tuning_read) {
    *out = (hoop__algo)comm->algo;
    return HOOP_OK;
  }
  long chunk;
  if (hoop__parse_int(hoop__env_get("HOOP_CHUNK_BYTES"), HOOP_CHUNK_MIN_BYTES, HOOP_CHUNK_MAX_BYTES,
                      &chunk) != 0)
    return hoop__set_error(
        comm, HOOP_ERR_INVALID_ARG, "%s: HOOP_CHUNK_BYTES '%s' is not a number of bytes in %d..%ld",
        comm->call, hoop__env_get("HOOP_CHUNK_BYTES"), HOOP_CHUNK_MIN_BYTES, HOOP_CHUNK_MAX_BYTES);
  comm->chunk_bytes = (size_t)chunk;
  const char *text = hoop__env_get("HOOP_ALGO");
  if (strcmp(text, "auto") == 0)
    *out = HOOP__ALGO_AUTO;
  else if (strcmp(text, "ring") == 0)
    *out = HOOP__ALGO_RING;
  else if (strcmp(text, "rd") == 0)
    *out = HOOP__ALGO_RD;
  else if (strcmp(text, "hd") == 0)
    *out = HOOP__ALGO_HD;
  else
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "%s: HOOP_ALGO '%s' is not one of auto, ring, rd, hd", comm->call, text);
  comm->algo = (int)*out;
  /* Every rank must choose alike: the rank count and the host's CPU count are the same on all of
   * them when all share one host. */
  comm->crowded = comm->local_size == comm->size && hoop__host_oversubscribed(comm);
  comm->tuning_read = 1;
  return HOOP_OK;
}
