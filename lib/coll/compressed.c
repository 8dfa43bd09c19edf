/* compressed.c - allreduce and reduce-scatter whose bytes between hosts travel in a smaller wire
 * format (hoop.h, hoop_compress; mem/compress.h), exact within each host. The shape is hier's:
 * each host's ranks reduce exactly among themselves, the ranks at the same place on every host
 * exchange their host's partial sums, and (allreduce) each host's ranks spread the result. The
 * exchange between hosts is direct rather than a ring, so that each value is rounded to the
 * format once on the way in, not at every hop: member j of the H members sums block j, its own
 * part exactly and the others' decoded, in float32 and in member order; for an allreduce it then
 * encodes the sum once and sends it to every member, and keeps the decoded values itself, so
 * every rank ends with the same bits. */
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "coll/state.h"
#include "mem/compress.h"
#include "mem/kind.h"
#include "mem/reduce.h"

/* Pieces start on cache lines in the exchange's buffer. */
static size_t line_up(size_t bytes) {
  return (bytes + 63) & ~(size_t)63;
}

/* One exchange among the members of group (one rank of each host): src holds count elements, this
 * host's partial sums; block j of them (hoop__segment's) is summed by member j. */
typedef struct exchange {
  const hoop__group *group;
  const char *src;
  char *dst; /* allreduce: every block; reduce-scatter: this member's block, at dst itself */
  size_t count, esize;
  hoop_dtype dtype;
  hoop_op op;
  int format, spread; /* spread: allreduce (every block to every member) */
  /* the buffer: a staged piece per block (sends), a received piece per member, the float sums */
  char *stage, *land;
  float *sum;
  size_t *first, *elems, *stage_at, *land_at; /* per member */
  hoop__transfer **recvs;                     /* per member: the receive of its piece */
} exchange;

/* The random bits of a stochastic encode: alike for every run of the job, different for every
 * call, rank and step (0 when the format rounds to nearest). */
static hoop__rounding rounding_of(const hoop_comm *comm, const exchange *ex, int step,
                                  size_t first) {
  if (!(ex->format & HOOP_COMPRESS_STOCHASTIC))
    return (hoop__rounding){0, 0};
  uint64_t seed = comm->seq * 0x9e3779b97f4a7c15u ^ (uint64_t)comm->rank << 32 ^ (uint64_t)step;
  return (hoop__rounding){seed | 1, first};
}

/* Lay the exchange's pieces out in the communicator's buffer for it. */
static hoop_result plan(hoop_comm *comm, exchange *ex) {
  int h = ex->group->size, me = ex->group->index;
  size_t *sizes = calloc(4 * (size_t)h, sizeof *sizes);
  ex->recvs = calloc((size_t)h, sizeof *ex->recvs);
  if (!sizes || !ex->recvs) {
    free(sizes);
    free(ex->recvs);
    ex->recvs = NULL;
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: out of memory", comm->call);
  }
  ex->first = sizes, ex->elems = sizes + h, ex->stage_at = sizes + 2 * h,
  ex->land_at = sizes + 3 * h;
  size_t staged = 0, landed = 0;
  for (int j = 0; j < h; j++) {
    hoop__segment(ex->count, h, j, &ex->first[j], &ex->elems[j]);
    size_t piece = line_up(hoop__compress_bytes(ex->format, ex->elems[j]));
    ex->stage_at[j] = staged;
    staged += piece;
  }
  /* A landing place holds a peer's piece of this member's block, then (allreduce) the peer's
   * finished block. */
  size_t mine = line_up(hoop__compress_bytes(ex->format, ex->elems[me]));
  for (int j = 0; j < h; j++) {
    size_t theirs = line_up(hoop__compress_bytes(ex->format, ex->elems[j]));
    ex->land_at[j] = landed;
    landed += j == me ? 0 : mine > theirs ? mine : theirs;
  }
  size_t sums = line_up(ex->elems[me] * sizeof(float));
  char *buf = hoop__host_buf_grow(comm, &comm->coll->compress_buf, staged + landed + sums, NULL,
                                  "for compressed pieces");
  if (!buf)
    return HOOP_ERR_SYSTEM;
  ex->stage = buf;
  ex->land = buf + staged;
  ex->sum = (float *)(void *)(buf + staged + landed);
  return HOOP_OK;
}

static void unplan(exchange *ex) {
  free(ex->first);
  free(ex->recvs);
}

/* Receive every peer's piece at its landing place: of this member's block (step one), or of the
 * peer's own (theirs: step two). */
static hoop_result post_receives(hoop_comm *comm, exchange *ex, hoop__arena *landing, int theirs) {
  int h = ex->group->size, me = ex->group->index;
  for (int k = 1; k < h; k++) {
    int j = (me + h - k) % h;
    size_t bytes = hoop__compress_bytes(ex->format, ex->elems[theirs ? j : me]);
    ex->recvs[j] = hoop__arena_next(comm, landing);
    if (!ex->recvs[j])
      return HOOP_ERR_SYSTEM;
    hoop_result result =
        hoop__irecv(comm, hoop__member(ex->group, j), ex->land + ex->land_at[j], bytes, ex->recvs[j]);
    if (result != HOOP_OK)
      return result;
  }
  return HOOP_OK;
}

/* Step one: every peer's block, encoded, to it (the next member first, so that no member is
 * everyone's first); this member's block summed in float32 from its own part and every peer's
 * piece, in member order. */
static hoop_result sum_block(hoop_comm *comm, exchange *ex, hoop__arena *sends,
                             hoop__arena *landing) {
  int h = ex->group->size, me = ex->group->index;
  hoop_result result = post_receives(comm, ex, landing, 0);
  for (int k = 1; k < h && result == HOOP_OK; k++) {
    int j = (me + k) % h;
    char *piece = ex->stage + ex->stage_at[j];
    hoop__compress(ex->format, piece, ex->src + ex->first[j] * ex->esize, ex->dtype, ex->elems[j],
                   NULL, rounding_of(comm, ex, 0, ex->first[j]));
    result = hoop__arena_isend(comm, sends, hoop__member(ex->group, j), piece,
                               hoop__compress_bytes(ex->format, ex->elems[j]));
  }
  if (result != HOOP_OK)
    return result;
  hoop__to_float(ex->sum, ex->src + ex->first[me] * ex->esize, ex->dtype, ex->elems[me]);
  for (int j = 0; j < h && result == HOOP_OK; j++)
    if (j != me && (result = hoop__wait(comm, ex->recvs[j])) == HOOP_OK)
      hoop__expand_add(ex->format, ex->sum, ex->land + ex->land_at[j], ex->elems[me]);
  if (result == HOOP_OK)
    hoop__reduce_finish(ex->sum, ex->elems[me], HOOP_FLOAT32, ex->op, comm->size);
  return result;
}

/* Step two of an allreduce: this member's sum, encoded once, to every peer and decoded into its
 * own place; every other block from the member that summed it. */
static hoop_result spread_blocks(hoop_comm *comm, exchange *ex, hoop__arena *sends,
                                 hoop__arena *landing) {
  int h = ex->group->size, me = ex->group->index;
  char *piece = ex->stage + ex->stage_at[me];
  size_t bytes = hoop__compress_bytes(ex->format, ex->elems[me]);
  hoop_result result = post_receives(comm, ex, landing, 1);
  if (result == HOOP_OK)
    hoop__compress(ex->format, piece, ex->sum, HOOP_FLOAT32, ex->elems[me], NULL,
                   rounding_of(comm, ex, 1, ex->first[me]));
  for (int k = 1; k < h && result == HOOP_OK; k++)
    result = hoop__arena_isend(comm, sends, hoop__member(ex->group, (me + k) % h), piece, bytes);
  if (result != HOOP_OK)
    return result;
  hoop__expand(ex->format, ex->dst + ex->first[me] * ex->esize, ex->dtype, piece, ex->elems[me]);
  for (int k = 1; k < h && result == HOOP_OK; k++) {
    int j = (me + h - k) % h;
    if ((result = hoop__wait(comm, ex->recvs[j])) == HOOP_OK)
      hoop__expand(ex->format, ex->dst + ex->first[j] * ex->esize, ex->dtype,
                   ex->land + ex->land_at[j], ex->elems[j]);
  }
  return result;
}

static hoop_result run_exchange(hoop_comm *comm, exchange *ex) {
  hoop_result result = plan(comm, ex);
  if (result != HOOP_OK)
    return result;
  hoop__arena sends = {0}, landing = {0};
  result = sum_block(comm, ex, &sends, &landing);
  if (result == HOOP_OK && ex->spread)
    result = spread_blocks(comm, ex, &sends, &landing);
  else if (result == HOOP_OK)
    hoop__from_float(ex->dst, ex->sum, ex->dtype, ex->elems[ex->group->index]);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &sends);
  hoop__arena_free(&landing);
  hoop__arena_free(&sends);
  unplan(ex);
  return result;
}

/* ---- the algorithms ------------------------------------------------------------------------- */

int hoop__compressed_fits(const hoop_comm *comm) {
  const hoop__hosts *hosts = comm->coll->hosts;
  return hosts && (hosts->even || (hosts->count == comm->size && comm->size > 1));
}

/* This rank's host's ranks, and the ranks at its place on every host. */
static void groups(const hoop_comm *comm, hoop__group *local, hoop__group *cross) {
  const hoop__hosts *hosts = comm->coll->hosts;
  *local = (hoop__group){hosts->per_host, hosts->local_index, hosts->local};
  *cross = (hoop__group){hosts->count, hosts->host_index, hosts->cross};
}

hoop_result hoop__allreduce_compressed(hoop_comm *comm, const hoop__coll_args *args) {
  if (!args->compress || !hoop__compressed_fits(comm))
    return hoop__allreduce_hier(comm, args);
  hoop__group local, cross;
  groups(comm, &local, &cross);
  size_t esize = args->esize;
  exchange ex = {.group = &cross,
                 .src = args->sendbuf,
                 .dst = args->recvbuf,
                 .count = args->count,
                 .esize = esize,
                 .dtype = args->dtype,
                 .op = args->op,
                 .format = args->compress,
                 .spread = 1};
  if (local.size == 1)
    return run_exchange(comm, &ex);
  /* hier's steps within the host, exact, around the exchange of this rank's segment. */
  size_t *offset = comm->coll->block_offset, *length = comm->coll->block_length;
  for (int i = 0; i < local.size; i++) {
    size_t first, elems;
    hoop__segment(args->count, local.size, i, &first, &elems);
    offset[i] = first * esize;
    length[i] = elems * esize;
  }
  int own = (local.index + 1) % local.size;
  size_t chunk_max = hoop__chunk_bytes(comm, length[0], esize);
  char *scratch = hoop__kind_scratch(comm, HOOP__RING_RECV_DEPTH * chunk_max);
  if (!scratch)
    return HOOP_ERR_SYSTEM;
  hoop__arena arena = {0};
  hoop__ring_rs rs = {args->sendbuf, args->recvbuf, NULL,        offset,   length, 0,
                      scratch,       chunk_max,     args->dtype, args->op, 0,      0};
  hoop_result result = hoop__ring_reduce_scatter(comm, &local, &arena, &rs);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  ex.src = ex.dst = (char *)args->recvbuf + offset[own];
  ex.count = length[own] / esize;
  if (result == HOOP_OK)
    result = run_exchange(comm, &ex);
  if (result == HOOP_OK)
    result = hoop__ring_circulate(comm, &local, &arena, args->recvbuf, offset, length, 1, esize, 0);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  hoop__arena_free(&arena);
  return result;
}

/* A reduce-scatter: the ranks at place l of every host own their blocks together, so each host's
 * ranks first reduce exactly a copy of the input laid out by place (place l's blocks, in host
 * order, together), which leaves the rank at place l its host's partial sums of them; the
 * exchange then sums each rank's block across the hosts. */
hoop_result hoop__reduce_scatter_compressed(hoop_comm *comm, const hoop__coll_args *args) {
  if (!args->compress || !hoop__compressed_fits(comm))
    return hoop__reduce_scatter_ring(comm, args);
  hoop__group local, cross;
  groups(comm, &local, &cross);
  const hoop__hosts *hosts = comm->coll->hosts;
  size_t esize = args->esize, block = args->bytes, part = block * (size_t)cross.size;
  exchange ex = {.group = &cross,
                 .src = args->sendbuf,
                 .dst = args->recvbuf,
                 .count = args->count * (size_t)cross.size,
                 .esize = esize,
                 .dtype = args->dtype,
                 .op = args->op,
                 .format = args->compress};
  if (local.size == 1)
    return run_exchange(comm, &ex);
  char *laid = hoop__host_buf_grow(comm, &comm->coll->compress_input, part * (size_t)local.size,
                                   NULL, "for a compressed reduce-scatter's input");
  if (!laid)
    return HOOP_ERR_SYSTEM;
  for (int l = 0; l < local.size; l++)
    for (int h = 0; h < cross.size; h++)
      memcpy(laid + (size_t)l * part + (size_t)h * block,
             (const char *)args->sendbuf + (size_t)hosts->at[h * local.size + l] * block, block);
  size_t *offset = comm->coll->block_offset, *length = comm->coll->block_length;
  for (int l = 0; l < local.size; l++) {
    offset[l] = (size_t)l * part;
    length[l] = part;
  }
  size_t chunk_max = hoop__chunk_bytes(comm, part, esize);
  char *scratch = hoop__kind_scratch(comm, HOOP__RING_RECV_DEPTH * chunk_max);
  if (!scratch)
    return HOOP_ERR_SYSTEM;
  hoop__arena arena = {0};
  /* shift size - 1: member l ends holding part l. */
  hoop__ring_rs rs = {laid,    laid,      NULL,        offset,   length, local.size - 1,
                      scratch, chunk_max, args->dtype, args->op, 0,      0};
  hoop_result result = hoop__ring_reduce_scatter(comm, &local, &arena, &rs);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  hoop__arena_free(&arena);
  ex.src = laid + offset[local.index];
  return result == HOOP_OK ? run_exchange(comm, &ex) : result;
}

void hoop__compressed_free(hoop_comm *comm) {
  hoop__host_buf_free(comm, &comm->coll->compress_buf);
  hoop__host_buf_free(comm, &comm->coll->compress_input);
}
