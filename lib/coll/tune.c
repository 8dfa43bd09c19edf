/* tune.c - every algorithm a collective can run, by name, and every cut-over between them, in two
 * tables; and HOOP_ALGO and HOOP_CHUNK_BYTES, which override them. The measurements behind each
 * cut-over are in bench/TUNING.md. Both variables are read once per communicator, at its first
 * allreduce, broadcast or allgather that has data; a bad value fails that call and every later one,
 * each with the same message. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "coll/coll.h"
#include "core/env.h"

/* ---- the algorithms ----------------------------------------------------------------------------
 */

typedef struct algorithm {
  hoop__coll coll;
  const char *name; /* HOOP_ALGO=coll:name */
  hoop__algo_fn run;
  const char *what;
} algorithm;

static const algorithm algorithms[] = {
    {HOOP__COLL_ALLREDUCE, "ring", hoop__allreduce_ring, "ring reduce-scatter + ring allgather"},
    {HOOP__COLL_ALLREDUCE, "rd", hoop__allreduce_rd, "recursive doubling"},
    {HOOP__COLL_ALLREDUCE, "hd", hoop__allreduce_hd, "Rabenseifner's halving-doubling"},
    {HOOP__COLL_ALLREDUCE, "hier", hoop__allreduce_hier,
     "host by host: reduce-scatter on each host, ring across hosts, allgather on each host (the "
     "ring where hosts differ in rank count)"},
    {HOOP__COLL_ALLREDUCE, "direct", hoop__allreduce_direct,
     "each rank reduces its segment from every other rank's part, then takes every other segment "
     "from its owner"},
    {HOOP__COLL_BROADCAST, "chain", hoop__broadcast_chain, "pipelined chain around the ring"},
    {HOOP__COLL_BROADCAST, "tree", hoop__broadcast_tree, "binomial tree"},
    {HOOP__COLL_ALLGATHER, "ring", hoop__allgather_ring, "pipelined ring"},
    {HOOP__COLL_ALLGATHER, "rd", hoop__allgather_rd,
     "recursive doubling (Bruck's rounds when the rank count is not a power of two)"},
    {HOOP__COLL_ALLGATHER, "bruck", hoop__allgather_bruck, "Bruck's algorithm"},
    {HOOP__COLL_ALLGATHER, "direct", hoop__allgather_direct,
     "every block straight from its owner to every rank, in one round"},
    {HOOP__COLL_BARRIER, "dissemination", hoop__barrier_dissemination, "dissemination"},
};
#define ALGORITHMS (sizeof algorithms / sizeof algorithms[0])

static const char *const coll_names[HOOP__COLL_COUNT] = {"allreduce", "broadcast", "allgather",
                                                         "barrier"};

/* HOOP_ALGO's single words, as before it named collectives: a family for every collective. */
static const struct family {
  const char *name;
  const char *per_coll[HOOP__COLL_COUNT]; /* NULL: the collective chooses as under auto */
} families[] = {
    {"ring", {"ring", "chain", "ring", NULL}},
    {"rd", {"rd", "tree", "rd", NULL}},
    {"hd", {"hd", "tree", "rd", NULL}},
};

/* ---- the cut-overs ----------------------------------------------------------------------------
 */

/* A row applies to a call of coll whose bytes (allgather: the gathered bytes) are at most
 * max_bytes, on a job whose shape has every bit of when; the first row that applies wins. */
#define ANY 0u
#define TWO_RANKS 1u /* exactly 2 ranks */
#define POW2 2u      /* a power-of-two rank count */
#define NOT_POW2 4u  /* any other */
#define ONE_HOST 8u  /* every rank on this host */
#define CROWDED 16u  /* every rank on this host, and more ranks than its CPUs */
#define HOSTS 32u    /* several hosts, each with the same number of ranks, at least 2 */
#define SHARED 64u   /* every peer of every rank on shared memory */
#define NO_LIMIT SIZE_MAX

typedef struct cutover {
  hoop__coll coll;
  unsigned when;
  size_t max_bytes;
  hoop__algo_fn algo; /* one of the algorithms above */
} cutover;

static const cutover cutovers[] = {
    /* 2 ranks: rd's one exchange wins until the ring (= halving-doubling there) moves half the
     * bytes per rank; over shared memory sooner (rd's copies of the whole buffer cost more than
     * a wait: 13.0 against 11.4 us at 64 KiB, 105 against 34 at 256 KiB). */
    {HOOP__COLL_ALLREDUCE, TWO_RANKS | SHARED, 32 * 1024, hoop__allreduce_rd},
    {HOOP__COLL_ALLREDUCE, TWO_RANKS | SHARED, NO_LIMIT, hoop__allreduce_ring},
    {HOOP__COLL_ALLREDUCE, TWO_RANKS, 256 * 1024, hoop__allreduce_rd},
    {HOOP__COLL_ALLREDUCE, TWO_RANKS, NO_LIMIT, hoop__allreduce_ring},
    {HOOP__COLL_ALLREDUCE, ANY, 32 * 1024, hoop__allreduce_rd},
    /* 3 ranks and more on one host: each rank reduces its segment straight from the others' parts
     * and takes the others' segments from their owners, with no chain of hops between. 4 ranks on
     * 2 cores: 3.5x halving-doubling at 64 KiB, 1.3x at 4 MiB, level with the ring from 16 MiB. */
    {HOOP__COLL_ALLREDUCE, ONE_HOST, NO_LIMIT, hoop__allreduce_direct},
    /* Several ranks on each host: the network carries 2(H-1)/H of the buffer per host instead of
     * the flat ring's 2(n-1)/n, and the hops within hosts share memory. On 4 hosts of 2 ranks at
     * 1 Gbit/s it beat halving-doubling from 64 KiB and the ring at every size (TUNING.md). */
    {HOOP__COLL_ALLREDUCE, HOSTS, NO_LIMIT, hoop__allreduce_hier},
    /* Halving-doubling's 2 log2(n) rounds beat the ring's 2(n-1) waits until the ring's pipelining
     * wins (across hosts, as each round's end idles the links while the ring streams); and
     * sooner still when ranks fold, whose whole-buffer transfers cost more than the rounds save. */
    {HOOP__COLL_ALLREDUCE, POW2, 1024 * 1024, hoop__allreduce_hd},
    {HOOP__COLL_ALLREDUCE, NOT_POW2, 256 * 1024, hoop__allreduce_hd},
    {HOOP__COLL_ALLREDUCE, ANY, NO_LIMIT, hoop__allreduce_ring},
    /* The tree's fewer hops win for small buffers and at 2 ranks; on a crowded host at every size:
     * there is no link to fill, and the chain's ranks pay a wakeup per chunk per hop. */
    {HOOP__COLL_BROADCAST, TWO_RANKS, NO_LIMIT, hoop__broadcast_tree},
    {HOOP__COLL_BROADCAST, CROWDED, NO_LIMIT, hoop__broadcast_tree},
    {HOOP__COLL_BROADCAST, ANY, 64 * 1024 - 1, hoop__broadcast_tree},
    {HOOP__COLL_BROADCAST, ANY, NO_LIMIT, hoop__broadcast_chain},
    /* log2(n) rounds beat the ring's n-1 hops up to a size; recursive doubling (power-of-two rank
     * counts) goes further than Bruck, which stages and rotates; across hosts less far. */
    {HOOP__COLL_ALLGATHER, POW2 | ONE_HOST, 4 * 1024 * 1024, hoop__allgather_rd},
    {HOOP__COLL_ALLGATHER, POW2, 1024 * 1024, hoop__allgather_rd},
    {HOOP__COLL_ALLGATHER, ANY, 256 * 1024, hoop__allgather_bruck},
    {HOOP__COLL_ALLGATHER, ANY, NO_LIMIT, hoop__allgather_ring},
    {HOOP__COLL_BARRIER, ANY, NO_LIMIT, hoop__barrier_dissemination},
};
#define CUTOVERS (sizeof cutovers / sizeof cutovers[0])

/* The job's shape, the same on every rank: the rank count, and the rank table's host counts. */
static unsigned job_shape(const hoop_comm *comm) {
  int n = comm->size;
  unsigned shape = (n & (n - 1)) == 0 ? POW2 : NOT_POW2;
  if (n == 2)
    shape |= TWO_RANKS;
  if (comm->local_size == n)
    shape |= ONE_HOST;
  if (comm->crowded)
    shape |= CROWDED;
  if (comm->hosts && comm->hosts->even)
    shape |= HOSTS;
  if (comm->all_shared)
    shape |= SHARED;
  return shape;
}

static const algorithm *find(hoop__coll coll, const char *name, size_t len) {
  for (size_t i = 0; i < ALGORITHMS; i++)
    if (algorithms[i].coll == coll && strlen(algorithms[i].name) == len &&
        strncmp(algorithms[i].name, name, len) == 0)
      return &algorithms[i];
  return NULL;
}

/* ---- HOOP_ALGO ------------------------------------------------------------------------------- */

static hoop_result bad_algo(hoop_comm *comm, const char *text, const char *why) {
  return hoop__set_error(
      comm, HOOP_ERR_INVALID_ARG,
      "%s: HOOP_ALGO '%s' %s (auto, ring, rd, hd, or a list such as "
      "'allreduce:hd,broadcast:chain'; allreduce: ring, rd, hd, hier, direct; broadcast: "
      "chain, tree; allgather: ring, rd, bruck, direct; barrier: dissemination)",
      comm->call, text, why);
}

/* One word of HOOP_ALGO: a family, or coll:algorithm. */
static hoop_result parse_word(hoop_comm *comm, const char *text, const char *word, size_t len,
                              const algorithm **forced) {
  const char *colon = memchr(word, ':', len);
  if (!colon) {
    if (len == 4 && strncmp(word, "auto", 4) == 0) {
      for (int c = 0; c < HOOP__COLL_COUNT; c++)
        forced[c] = NULL;
      return HOOP_OK;
    }
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++)
      if (strlen(families[f].name) == len && strncmp(families[f].name, word, len) == 0) {
        for (int c = 0; c < HOOP__COLL_COUNT; c++) {
          const char *name = families[f].per_coll[c];
          forced[c] = name ? find((hoop__coll)c, name, strlen(name)) : NULL;
        }
        return HOOP_OK;
      }
    return bad_algo(comm, text, "is not one of these");
  }
  for (int c = 0; c < HOOP__COLL_COUNT; c++)
    if (strlen(coll_names[c]) == (size_t)(colon - word) &&
        strncmp(coll_names[c], word, (size_t)(colon - word)) == 0) {
      size_t name_len = len - (size_t)(colon - word) - 1;
      if (name_len == 4 && strncmp(colon + 1, "auto", 4) == 0) {
        forced[c] = NULL;
        return HOOP_OK;
      }
      forced[c] = find((hoop__coll)c, colon + 1, name_len);
      return forced[c] ? HOOP_OK : bad_algo(comm, text, "names an algorithm the collective lacks");
    }
  return bad_algo(comm, text, "names no collective");
}

static hoop_result parse_algo(hoop_comm *comm, const char *text) {
  const algorithm *forced[HOOP__COLL_COUNT] = {NULL};
  const char *at = text;
  do {
    size_t len = strcspn(at, ",");
    if (len == 0)
      return bad_algo(comm, text, "has an empty entry");
    hoop_result result = parse_word(comm, text, at, len, forced);
    if (result != HOOP_OK)
      return result;
    at += len;
  } while (*at++ == ',');
  for (int c = 0; c < HOOP__COLL_COUNT; c++) {
    comm->forced_algo[c] = forced[c] ? (int)(forced[c] - algorithms) : -1;
    if (forced[c])
      HOOP__INFO(HOOP_SUBSYS_COLL, "HOOP_ALGO=%s: %s runs %s (%s) at every size", text,
                 coll_names[c], forced[c]->name, forced[c]->what);
  }
  return HOOP_OK;
}

static hoop_result read_tuning(hoop_comm *comm) {
  long chunk;
  if (hoop__parse_int(hoop__env_get("HOOP_CHUNK_BYTES"), HOOP__CHUNK_MIN_BYTES,
                      HOOP__CHUNK_MAX_BYTES, &chunk) != 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "%s: HOOP_CHUNK_BYTES '%s' is not a number of bytes in %d..%ld",
                           comm->call, hoop__env_get("HOOP_CHUNK_BYTES"), HOOP__CHUNK_MIN_BYTES,
                           HOOP__CHUNK_MAX_BYTES);
  comm->chunk_bytes = (size_t)chunk;
  hoop_result result = parse_algo(comm, hoop__env_get("HOOP_ALGO"));
  if (result != HOOP_OK)
    return result;
  /* Every rank must choose alike: the rank count and the host's CPU count are the same on all of
   * them when all share one host. */
  comm->crowded = comm->local_size == comm->size && hoop__host_oversubscribed(comm);
  /* Alike on every rank too: shared memory joins a pair only where both ends offer it. */
  comm->all_shared = 1;
  for (int peer = 0; peer < comm->size; peer++)
    if (peer != comm->rank && strcmp(hoop__transport_of(comm, peer)->ops->name, "shm") != 0)
      comm->all_shared = 0;
  if (!comm->hosts && (result = hoop__hosts_plan(comm)) != HOOP_OK)
    return result;
  comm->tuning_read = 1;
  return HOOP_OK;
}

const char *hoop__coll_algo_name(hoop__algo_fn fn) {
  for (size_t i = 0; i < ALGORITHMS; i++)
    if (algorithms[i].run == fn)
      return algorithms[i].name;
  return "?";
}

hoop_result hoop__coll_tune(hoop_comm *comm, const hoop__coll_args *args, hoop__algo_fn *out) {
  hoop_result result;
  if (!comm->tuning_read && (result = read_tuning(comm)) != HOOP_OK)
    return result;
  int forced = comm->forced_algo[args->coll];
  if (forced >= 0) {
    *out = algorithms[forced].run;
    return HOOP_OK;
  }
  size_t bytes =
      args->coll == HOOP__COLL_ALLGATHER ? args->bytes * (size_t)comm->size : args->bytes;
  unsigned shape = job_shape(comm);
  for (size_t i = 0; i < CUTOVERS; i++) {
    const cutover *row = &cutovers[i];
    if (row->coll == args->coll && (shape & row->when) == row->when && bytes <= row->max_bytes) {
      *out = row->algo;
      return HOOP_OK;
    }
  }
  return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: no algorithm fits (tune.c's table)",
                         comm->call);
}
