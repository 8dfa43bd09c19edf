/* allreduce.c - hoop_allreduce: for large buffers a ring reduce-scatter followed by a ring
 * allgather, both pipelined in chunks, so that each rank sends and receives 2(n-1)/n of the buffer,
 * the bandwidth optimum; for small ones recursive doubling, log2(n) exchanges of the whole buffer,
 * the latency optimum; in between, at 3 ranks and more, Rabenseifner's halving-doubling, which
 * moves the ring's bytes in 2 log2(n) rounds.
 *
 * Reduce-scatter: at step s rank r receives from the previous rank a chunk of segment r-s-1 that
 * holds the sum of s+1 ranks' contributions, adds its own (reading sendbuf, writing recvbuf, so the
 * out-of-place case needs no initial copy), and forwards the sum at once. After n-1 steps rank r
 * holds the full result of segment r+1, which the allgather circulates.
 */
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "coll/state.h"

typedef struct ring_plan {
  size_t *offset; /* bytes, per segment */
  size_t *length; /* bytes, per segment */
} ring_plan;

static void plan_segments(hoop_comm *comm, size_t count, size_t esize, ring_plan *plan) {
  hoop__plan_segments(comm, count, esize);
  plan->offset = comm->coll->block_offset;
  plan->length = comm->coll->block_length;
}

/* dst = op(lower rank's part, higher rank's part), whichever of mine and theirs is this rank's:
 * partners that combine this way compute the same expression, in recursive doubling and in the
 * halving rounds alike. */
static hoop_result combine(hoop_comm *comm, char *dst, const char *mine, const char *theirs,
                           int mine_is_lower, size_t count, hoop_dtype dtype, hoop_op op) {
  return mine_is_lower ? hoop__kind_reduce3(comm, dst, mine, theirs, count, dtype, op)
                       : hoop__kind_reduce3(comm, dst, theirs, mine, count, dtype, op);
}

/* Recursive doubling. With p the largest power of two <= n and rem = n - p, the first 2*rem ranks
 * pair up first: each even one hands its buffer to the odd one above and waits for the result, so
 * p ranks remain. In round k each of them exchanges its partial result with the rank whose virtual
 * number differs in bit k and combines the two. Partners always combine as op(lower rank's part,
 * higher rank's part), so every rank computes the same expression and ends with the same bits,
 * NaNs in min/max and float rounding included. */
static hoop_result recursive_doubling(hoop_comm *comm, char *buf, size_t count, hoop_dtype dtype,
                                      hoop_op op) {
  int r = comm->rank;
  size_t bytes = count * hoop_dtype_size(dtype);
  char *scratch = hoop__kind_scratch(comm, bytes);
  if (!scratch)
    return HOOP_ERR_SYSTEM;
  hoop__halving plan; /* only its pairing is used: p, rem and the virtual ranks */
  hoop__halving_plan(comm, count, &plan);
  hoop__transfer req;
  hoop_result result;
  if (plan.folded) {
    result = hoop__isend(comm, r + 1, buf, bytes, &req);
    if (result == HOOP_OK)
      result = hoop__wait(comm, &req);
    if (result == HOOP_OK)
      result = hoop__irecv(comm, r + 1, buf, bytes, &req);
    return result == HOOP_OK ? hoop__wait(comm, &req) : result;
  }
  if (r < 2 * plan.rem) {
    result = hoop__irecv(comm, r - 1, scratch, bytes, &req);
    if (result == HOOP_OK)
      result = hoop__wait(comm, &req);
    if (result == HOOP_OK)
      result = combine(comm, buf, buf, scratch, 0, count, dtype, op);
    if (result != HOOP_OK)
      return result;
  }
  for (int mask = 1; mask < plan.p; mask <<= 1) {
    int peer = hoop__halving_rank(&plan, plan.vrank ^ mask);
    result = hoop__sendrecv(comm, peer, buf, bytes, peer, scratch, bytes);
    if (result == HOOP_OK)
      result = combine(comm, buf, buf, scratch, r < peer, count, dtype, op);
    if (result != HOOP_OK)
      return result;
  }
  if ((result = hoop__kind_finish(comm, buf, count, dtype, op, comm->size)) != HOOP_OK)
    return result;
  if (r < 2 * plan.rem) {
    result = hoop__isend(comm, r - 1, buf, bytes, &req);
    if (result == HOOP_OK)
      result = hoop__wait(comm, &req);
  }
  return result;
}

/* Rabenseifner's algorithm: a reduce-scatter by recursive halving, then an allgather by recursive
 * doubling, on the plan of coll.h (ranks beyond a power of two fold in first, as in recursive
 * doubling). In each halving round a rank sends the half of its range that it gives up and adds
 * its partner's copy of the half it keeps to its own; after log2(p) rounds it owns the finished
 * 1/p of the buffer, and the doubling rounds spread the parts. Every rank sends and receives
 * 2(p-1)/p of the buffer, as in the ring, but in 2 log2(p) rounds instead of 2(n-1): fewer waits,
 * each between two ranks only. Each element is reduced on one rank, so all ranks end with the
 * same bits. */

/* One halving round's receives: the peer's chunks of the kept range, into HOOP__RING_RECV_DEPTH
 * slices of scratch of slice bytes each, cut as the peer cuts its sends (from the same length). */
typedef struct halving_pass {
  int peer;
  size_t keep_len, chunk, done;
  char *scratch;
  size_t slice;
} halving_pass;

static int halving_next(void *arg, size_t slot, hoop__chunk *chunk) {
  halving_pass *pass = arg;
  if (pass->done >= pass->keep_len)
    return 0;
  chunk->peer = pass->peer;
  chunk->at = pass->done;
  chunk->len =
      pass->keep_len - pass->done < pass->chunk ? pass->keep_len - pass->done : pass->chunk;
  chunk->dst = pass->scratch + slot * pass->slice;
  pass->done += chunk->len;
  return 1;
}

/* One round between this rank and peer: send [give, give + give_len) in chunks, receive the
 * peer's chunks of the kept range and reduce each as it lands: dst = op(lower rank's part, higher
 * rank's part), where this rank's part is src. */
static hoop_result halving_round(hoop_comm *comm, hoop__arena *arena, int peer, const char *give,
                                 size_t give_len, char *dst, const char *src, size_t keep_len,
                                 char *scratch, size_t slice, hoop_dtype dtype, hoop_op op) {
  size_t esize = hoop_dtype_size(dtype);
  hoop_result result = hoop__arena_isend_chunks(comm, arena, peer, give, give_len, esize);
  halving_pass pass = {peer, keep_len, hoop__chunk_bytes(comm, keep_len, esize), 0, scratch, slice};
  hoop__recv_ahead ahead;
  hoop__recv_ahead_init(&ahead, HOOP__RING_RECV_DEPTH, halving_next, &pass);
  int mine_is_lower = comm->rank < peer;
  const hoop__chunk *chunk;
  while (result == HOOP_OK && (result = hoop__recv_ahead_take(comm, &ahead, &chunk)) == HOOP_OK &&
         chunk)
    result = combine(comm, dst + chunk->at, src + chunk->at, chunk->dst, mine_is_lower,
                     chunk->len / esize, dtype, op);
  return result;
}

hoop_result hoop__halving_reduce(hoop_comm *comm, hoop__arena *arena, const char *sendbuf,
                                 char *work, size_t count, hoop_dtype dtype, hoop_op op,
                                 char *scratch, size_t slice, const hoop__halving *plan) {
  int r = comm->rank;
  size_t esize = hoop_dtype_size(dtype), bytes = count * esize;
  hoop_result result;
  const char *src = sendbuf; /* this rank's contribution, until the first reduction lands */
  if (r < 2 * plan->rem) {
    result =
        halving_round(comm, arena, r - 1, NULL, 0, work, sendbuf, bytes, scratch, slice, dtype, op);
    if (result != HOOP_OK)
      return result;
    src = work;
  }
  for (int round = 0; round < plan->rounds; round++) {
    int mask = plan->mask[round];
    int peer = hoop__halving_rank(plan, plan->vrank ^ mask);
    size_t keep_first = round + 1 < plan->rounds ? plan->lo[round + 1] : plan->first;
    size_t keep_last = round + 1 < plan->rounds ? plan->hi[round + 1] : plan->last;
    size_t give_first = plan->vrank & mask ? plan->lo[round] : keep_last;
    size_t give_last = plan->vrank & mask ? keep_first : plan->hi[round];
    result =
        halving_round(comm, arena, peer, src + give_first * esize, (give_last - give_first) * esize,
                      work + keep_first * esize, src + keep_first * esize,
                      (keep_last - keep_first) * esize, scratch, slice, dtype, op);
    if (result != HOOP_OK)
      return result;
    src = work;
  }
  return HOOP_OK;
}

/* Sends need not be waited for round by round: a range this rank gave away in the halving round
 * with mask m is written again only in the doubling round with mask m, by the same partner, which
 * sends it only after it has received all of that range. */
static hoop_result halving_doubling(hoop_comm *comm, hoop__arena *arena, const char *sendbuf,
                                    char *recvbuf, size_t count, hoop_dtype dtype, hoop_op op,
                                    int near_first) {
  int r = comm->rank;
  size_t esize = hoop_dtype_size(dtype), bytes = count * esize;
  /* Every range a round receives is at most the whole buffer, so its chunks are at most this. */
  size_t slice = hoop__chunk_bytes(comm, bytes, esize);
  char *scratch = hoop__kind_scratch(comm, HOOP__RING_RECV_DEPTH * slice);
  if (!scratch)
    return HOOP_ERR_SYSTEM;
  hoop__halving plan;
  hoop__halving_plan_order(comm, count, near_first, &plan);
  hoop_result result;
  if (plan.folded) {
    hoop__transfer req;
    result = hoop__arena_isend_chunks(comm, arena, r + 1, sendbuf, bytes, esize);
    if (result == HOOP_OK)
      result = hoop__irecv(comm, r + 1, recvbuf, bytes, &req);
    return result == HOOP_OK ? hoop__wait(comm, &req) : result;
  }
  result =
      hoop__halving_reduce(comm, arena, sendbuf, recvbuf, count, dtype, op, scratch, slice, &plan);
  if (result != HOOP_OK)
    return result;
  result = hoop__kind_finish(comm, recvbuf + plan.first * esize, plan.last - plan.first, dtype, op,
                             comm->size);
  if (result == HOOP_OK)
    result = hoop__doubling_rounds(comm, arena, recvbuf, esize, &plan);
  if (result == HOOP_OK && r < 2 * plan.rem)
    result = hoop__arena_isend(comm, arena, r - 1, recvbuf, bytes);
  return result;
}

/* ---- the algorithms, as the dispatcher calls them ---------------------------------------------
 */

static hoop_result allreduce_halving(hoop_comm *comm, const hoop__coll_args *args, int near_first) {
  hoop__arena arena = {0};
  hoop_result result = halving_doubling(comm, &arena, args->sendbuf, args->recvbuf, args->count,
                                        args->dtype, args->op, near_first);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  hoop__arena_free(&arena);
  return result;
}

hoop_result hoop__allreduce_hd(hoop_comm *comm, const hoop__coll_args *args) {
  return allreduce_halving(comm, args, 0);
}

/* Reproducible mode's halving-doubling: the same rounds with neighbours paired first, so that
 * each part is combined over the fixed tree (the fold's pairs, then adjacent pairs, pairs of
 * pairs; the lower rank's part on the left) and moves what halving-doubling moves. */
hoop_result hoop__allreduce_repro_hd(hoop_comm *comm, const hoop__coll_args *args) {
  return allreduce_halving(comm, args, 1);
}

hoop_result hoop__allreduce_rd(hoop_comm *comm, const hoop__coll_args *args) {
  hoop_result result = HOOP_OK;
  if (args->sendbuf != args->recvbuf &&
      (result = hoop__kind_copy(comm, args->recvbuf, args->sendbuf, args->bytes)) != HOOP_OK)
    return result;
  return recursive_doubling(comm, args->recvbuf, args->count, args->dtype, args->op);
}

hoop_result hoop__allreduce_ring(hoop_comm *comm, const hoop__coll_args *args) {
  ring_plan plan;
  plan_segments(comm, args->count, args->esize, &plan);
  /* Segment 0 is never smaller than the others, so its chunk is the largest. */
  size_t chunk_max = hoop__chunk_bytes(comm, plan.length[0], args->esize);
  char *scratch = hoop__kind_scratch(comm, HOOP__RING_RECV_DEPTH * chunk_max);
  if (!scratch)
    return HOOP_ERR_SYSTEM;
  hoop__arena arena = {0};
  hoop__group whole = hoop__whole(comm);
  hoop__ring_rs rs = {args->sendbuf, args->recvbuf, NULL,        plan.offset, plan.length, 0,
                      scratch,       chunk_max,     args->dtype, args->op,    1,           1};
  hoop_result result = hoop__ring_reduce_scatter(comm, &whole, &arena, &rs);
  if (result == HOOP_OK)
    result = hoop__ring_circulate(comm, &whole, &arena, args->recvbuf, plan.offset, plan.length, 1,
                                  args->esize, 1);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  hoop__arena_free(&arena);
  return result;
}

hoop_result hoop__allreduce_group(hoop_comm *comm, const hoop__group *group, char *buf,
                                  size_t count, hoop_dtype dtype, hoop_op op) {
  size_t esize = hoop_dtype_size(dtype);
  ring_plan plan = {comm->coll->hosts->offset, comm->coll->hosts->length};
  for (int i = 0; i < group->size; i++) {
    size_t first, elems;
    hoop__segment(count, group->size, i, &first, &elems);
    plan.offset[i] = first * esize;
    plan.length[i] = elems * esize;
  }
  size_t chunk_max = hoop__chunk_bytes(comm, plan.length[0], esize);
  char *scratch = hoop__kind_scratch(comm, HOOP__RING_RECV_DEPTH * chunk_max);
  if (!scratch)
    return HOOP_ERR_SYSTEM;
  hoop__arena arena = {0};
  hoop__ring_rs rs = {buf,     buf,       NULL,  plan.offset, plan.length, 0,
                      scratch, chunk_max, dtype, op,          1,           1};
  hoop_result result = hoop__ring_reduce_scatter(comm, group, &arena, &rs);
  if (result == HOOP_OK)
    result = hoop__ring_circulate(comm, group, &arena, buf, plan.offset, plan.length, 1, esize, 1);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  hoop__arena_free(&arena);
  return result;
}

/* Host by host, for jobs whose hosts each run the same number of ranks, L, on H hosts: a ring
 * reduce-scatter among the ranks of each host leaves each of them one of L segments summed over
 * its host; the ranks at the same place on every host then allreduce that segment among
 * themselves (ring reduce-scatter and allgather over H), L such rings at once; and a ring
 * allgather on each host spreads the segments. Each host sends and receives 2(H-1)/H of the
 * buffer over the network, against 2(n-1)/n for the flat ring, and the hops within a host go
 * through shared memory. Each element is reduced on one rank, so all ranks end with the same
 * bits. Other jobs run the ring. */
hoop_result hoop__allreduce_hier(hoop_comm *comm, const hoop__coll_args *args) {
  const hoop__hosts *hosts = comm->coll->hosts;
  if (!hosts || !hosts->even)
    return hoop__allreduce_ring(comm, args);
  size_t esize = args->esize;
  hoop__group local = {hosts->per_host, hosts->local_index, hosts->local};
  hoop__group cross = {hosts->count, hosts->host_index, hosts->cross};
  ring_plan plan = {comm->coll->block_offset, comm->coll->block_length};
  for (int i = 0; i < local.size; i++) {
    size_t first, elems;
    hoop__segment(args->count, local.size, i, &first, &elems);
    plan.offset[i] = first * esize;
    plan.length[i] = elems * esize;
  }
  /* After the reduce-scatter, member r holds segment r + 1; it is allreduced across the hosts. */
  int own = (local.index + 1) % local.size;
  size_t chunk_max = hoop__chunk_bytes(comm, plan.length[0], esize);
  char *scratch = hoop__kind_scratch(comm, HOOP__RING_RECV_DEPTH * chunk_max);
  if (!scratch)
    return HOOP_ERR_SYSTEM;
  hoop__arena arena = {0};
  /* Each pass waits for its sends before the next one writes where they read. */
  hoop__ring_rs rs = {args->sendbuf, args->recvbuf, NULL,        plan.offset, plan.length, 0,
                      scratch,       chunk_max,     args->dtype, args->op,    0,           0};
  hoop_result result = hoop__ring_reduce_scatter(comm, &local, &arena, &rs);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  if (result == HOOP_OK)
    result = hoop__allreduce_group(comm, &cross, (char *)args->recvbuf + plan.offset[own],
                                   plan.length[own] / esize, args->dtype, args->op);
  if (result == HOOP_OK)
    result = hoop__ring_circulate(comm, &local, &arena, args->recvbuf, plan.offset, plan.length, 1,
                                  esize, 0);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  hoop__arena_free(&arena);
  return result;
}

/* Direct: each rank reduces its own segment straight from every other rank's contribution, then
 * takes every other finished segment straight from the rank that reduced it; MPI's shared-memory
 * collectives work this way. It moves the ring's bytes, 2(n-1)/n of the buffer per rank, but each
 * byte crosses once between its owner and its reducer instead of hopping around the ring: over
 * shared memory with CMA a peer's chunk is one copy out of its buffer, and a rank depends on no
 * chain of others, only on each of them once. A segment is combined on the one rank that owns it
 * (its own part, then the others in rank order), so all ranks end with the same bits. */

/* The chunks of this rank's segment, chunk by chunk, and within each from every peer in rank
 * order, into HOOP__RING_RECV_DEPTH slices of scratch. */
typedef struct direct_pass {
  const hoop_comm *comm;
  size_t first, length, chunk_len; /* this rank's segment, and its chunks */
  size_t done;                     /* bytes of the segment whose chunks were all handed out */
  int peer;                        /* next peer for the current chunk */
  char *scratch;
} direct_pass;

static int direct_next(void *arg, size_t slot, hoop__chunk *chunk) {
  direct_pass *pass = arg;
  if (pass->peer == pass->comm->rank)
    pass->peer++;
  if (pass->peer >= pass->comm->size) {
    pass->peer = pass->comm->rank == 0 ? 1 : 0;
    pass->done += pass->chunk_len;
  }
  if (pass->done >= pass->length)
    return 0;
  chunk->peer = pass->peer++;
  chunk->at = pass->first + pass->done;
  chunk->len =
      pass->length - pass->done < pass->chunk_len ? pass->length - pass->done : pass->chunk_len;
  chunk->dst = pass->scratch + slot * pass->chunk_len;
  return 1;
}

hoop_result hoop__direct_reduce(hoop_comm *comm, hoop__arena *arena, const char *src, char *own,
                                const size_t *offset, const size_t *length, size_t esize,
                                hoop_dtype dtype, hoop_op op) {
  int n = comm->size, r = comm->rank;
  size_t chunk_len = hoop__chunk_bytes(comm, length[r], esize);
  char *scratch = hoop__kind_scratch(comm, HOOP__RING_RECV_DEPTH * chunk_len);
  if (!scratch)
    return HOOP_ERR_SYSTEM;
  hoop_result result = HOOP_OK;
  /* Every peer's segment to it, starting with the next rank so that no rank is everyone's first.
   * An input still being fed in is waited for segment by segment, in this order. */
  for (int k = 1; k < n && result == HOOP_OK; k++) {
    int peer = (r + k) % n;
    result = hoop__kind_need(comm, src + offset[peer], length[peer]);
    if (result == HOOP_OK)
      result = hoop__arena_isend_chunks(comm, arena, peer, src + offset[peer], length[peer], esize);
  }
  if (result == HOOP_OK)
    result = hoop__kind_need(comm, src + offset[r], length[r]);
  direct_pass pass = {comm, offset[r], length[r], chunk_len, 0, r == 0 ? 1 : 0, scratch};
  hoop__recv_ahead ahead;
  hoop__recv_ahead_init(&ahead, HOOP__RING_RECV_DEPTH, direct_next, &pass);
  const hoop__chunk *chunk;
  while (result == HOOP_OK && (result = hoop__recv_ahead_take(comm, &ahead, &chunk)) == HOOP_OK &&
         chunk) {
    /* acc = op(this rank's own part, then every peer's in rank order): the first peer's chunk is
     * combined with mine, which acc may be (in place), the others with acc. */
    char *acc = own + (chunk->at - offset[r]);
    const char *mine = src + chunk->at;
    size_t count = chunk->len / esize;
    result = hoop__kind_reduce3(comm, acc, chunk->peer == (r == 0 ? 1 : 0) ? mine : acc, chunk->dst,
                                count, dtype, op);
    if (result != HOOP_OK)
      break;
    if (chunk->peer == (r == n - 1 ? n - 2 : n - 1)) {
      if ((result = hoop__kind_finish(comm, acc, count, dtype, op, n)) != HOOP_OK)
        break;
      hoop__kind_done(comm, acc, chunk->len);
    }
  }
  return result;
}

hoop_result hoop__direct_share(hoop_comm *comm, hoop__arena *arena, char *dst, const size_t *offset,
                               const size_t *length, size_t esize) {
  int n = comm->size, r = comm->rank;
  /* The receives of each other segment apart (indexed by its owner), to wait for them segment by
   * segment: a result that is drained while the call runs leaves as each one lands (mem/kind.h). */
  hoop__arena *landing = calloc((size_t)n, sizeof *landing);
  if (!landing)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: out of memory for requests", comm->call);
  /* A segment this rank sent from an in-place buffer is written here only once its owner has
   * finished it, after reading all of this rank's part. */
  hoop_result result = HOOP_OK;
  for (int k = 1; k < n && result == HOOP_OK; k++) {
    int peer = (r + k) % n;
    result = hoop__arena_isend_chunks(comm, arena, peer, dst + offset[r], length[r], esize);
  }
  for (int k = 1; k < n && result == HOOP_OK; k++) {
    int peer = (r - k + n) % n;
    size_t cut = hoop__chunk_bytes(comm, length[peer], esize);
    for (size_t done = 0; done < length[peer] && result == HOOP_OK; done += cut) {
      hoop__transfer *req = hoop__arena_next(comm, &landing[peer]);
      result = req ? hoop__irecv(comm, peer, dst + offset[peer] + done,
                                 length[peer] - done < cut ? length[peer] - done : cut, req)
                   : HOOP_ERR_SYSTEM;
    }
  }
  for (int k = 1; k < n && result == HOOP_OK; k++) {
    int peer = (r - k + n) % n;
    result = hoop__arena_wait_all(comm, &landing[peer]);
    if (result == HOOP_OK)
      hoop__kind_done(comm, dst + offset[peer], length[peer]);
  }
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, arena);
  for (int k = 0; k < n; k++)
    hoop__arena_free(&landing[k]);
  free(landing);
  return result;
}

hoop_result hoop__allreduce_direct(hoop_comm *comm, const hoop__coll_args *args) {
  ring_plan plan;
  plan_segments(comm, args->count, args->esize, &plan);
  char *dst = args->recvbuf;
  hoop__arena arena = {0};
  hoop_result result =
      hoop__direct_reduce(comm, &arena, args->sendbuf, dst + plan.offset[comm->rank], plan.offset,
                          plan.length, args->esize, args->dtype, args->op);
  if (result == HOOP_OK)
    result = hoop__direct_share(comm, &arena, dst, plan.offset, plan.length, args->esize);
  hoop__arena_free(&arena);
  return result;
}
