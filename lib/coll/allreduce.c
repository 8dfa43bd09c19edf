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
#include <string.h>

#include "coll/coll.h"
#include "mem/reduce.h"

/* The cut-overs, measured with hoop-bench on loopback (p50, median of 3 alternated runs of each
 * algorithm, forced with HOOP_ALGO; 1 MiB chunks):
 * - 2 ranks: recursive doubling wins up to 128 KiB (60.9 us against the ring's 64.8 at 128 KiB)
 *   and ties at 256 KiB; from 512 KiB the ring, which at 2 ranks is halving-doubling, moves half
 *   the bytes (178 against 233 us).
 * - 4 ranks: halving-doubling wins from 64 KiB (122 us, recursive doubling 140, ring 239) to
 *   4 MiB (6.5 ms, ring 8.3); they tie at 8 MiB, and from 16 MiB the ring's pipelining wins.
 *   That holds on one host. Across hosts each halving or doubling round waits for the last bytes
 *   of the one before, so the links idle at every round's end while the ring's chunks stream on:
 *   on 4 namespace hosts at 1 Gbit/s, busbw as a share of the link, 94.7% against the ring's
 *   95.7% at 1 MiB but 89.4% against 95.6% at 4 MiB. Across hosts it stops at 1 MiB.
 * - 3 ranks (folded halving-doubling; medians of 2 alternated sweeps): it wins from 64 KiB to
 *   256 KiB (206 us, ring 251, recursive doubling 346) and the ring from 512 KiB (385 against
 *   462 us), where the folding rank's whole-buffer transfers cost more than the rounds save. */
#define RD_MAX_BYTES_2 (256 * 1024)
#define RD_MAX_BYTES (32 * 1024)
#define HD_MAX_BYTES (1024 * 1024)
#define HD_MAX_BYTES_ONE_HOST (4 * 1024 * 1024)
#define HD_MAX_BYTES_FOLDED (256 * 1024)

static hoop__algo choose(const hoop_comm *comm, hoop__algo forced, size_t bytes) {
  if (forced != HOOP__ALGO_AUTO)
    return forced;
  int n = comm->size;
  if (n == 2)
    return bytes <= RD_MAX_BYTES_2 ? HOOP__ALGO_RD : HOOP__ALGO_RING;
  if (bytes <= RD_MAX_BYTES)
    return HOOP__ALGO_RD;
  size_t hd_max = HD_MAX_BYTES_FOLDED;
  if ((n & (n - 1)) == 0)
    hd_max = comm->local_size == n ? HD_MAX_BYTES_ONE_HOST : HD_MAX_BYTES;
  return bytes <= hd_max ? HOOP__ALGO_HD : HOOP__ALGO_RING;
}

typedef struct ring_plan {
  size_t *offset; /* bytes, per segment */
  size_t *length; /* bytes, per segment */
} ring_plan;

static void plan_segments(hoop_comm *comm, size_t count, size_t esize, ring_plan *plan) {
  plan->offset = comm->block_offset;
  plan->length = comm->block_length;
  for (int i = 0; i < comm->size; i++) {
    size_t first, elems;
    hoop__segment(count, comm->size, i, &first, &elems);
    plan->offset[i] = first * esize;
    plan->length[i] = elems * esize;
  }
}

static hoop_result reduce_scatter(hoop_comm *comm, hoop__arena *arena, const char *src, char *dst,
                                  const ring_plan *plan, char *staging, size_t chunk_max,
                                  hoop_dtype dtype, hoop_op op) {
  int n = comm->size, r = comm->rank;
  int next = hoop__ring_next(comm), prev = hoop__ring_prev(comm);
  size_t esize = hoop_dtype_size(dtype);
  /* Step 0 sends this rank's own contribution to segment r. */
  hoop_result result =
      hoop__arena_isend_chunks(comm, arena, next, src + plan->offset[r], plan->length[r], esize);
  /* Chunks arrive in staging, HOOP_RING_RECV_DEPTH slices of chunk_max bytes used in turn, so
   * that the next chunk's receive is posted before this one is reduced. */
  hoop__request reqs[HOOP_RING_RECV_DEPTH];
  int steps[HOOP_RING_RECV_DEPTH];
  size_t ats[HOOP_RING_RECV_DEPTH], lens[HOOP_RING_RECV_DEPTH];
  hoop__ring_cursor posting = {0, 0};
  size_t posted = 0, taken = 0;
  while (result == HOOP_OK) {
    while (result == HOOP_OK && posted < taken + HOOP_RING_RECV_DEPTH) {
      size_t k = posted % HOOP_RING_RECV_DEPTH;
      if (!hoop__ring_cursor_next(comm, &posting, plan->offset, plan->length, 0, esize, &steps[k],
                                  &ats[k], &lens[k]))
        break;
      result = hoop__irecv(comm, prev, staging + k * chunk_max, lens[k], &reqs[k]);
      posted++;
    }
    if (result != HOOP_OK || taken == posted)
      break;
    size_t k = taken++ % HOOP_RING_RECV_DEPTH;
    result = hoop__wait(comm, &reqs[k]);
    if (result != HOOP_OK)
      break;
    size_t at = ats[k], len = lens[k];
    hoop__reduce3(dst + at, src + at, staging + k * chunk_max, len / esize, dtype, op);
    if (steps[k] == n - 2)
      hoop__reduce_finish(dst + at, len / esize, dtype, op, n);
    /* Forward at once: to the next reduce-scatter step, or, on the last step, as this rank's
     * finished segment that starts the allgather. */
    result = hoop__arena_isend(comm, arena, next, dst + at, len);
  }
  return result;
}

/* dst = op(lower rank's part, higher rank's part), whichever of mine and theirs is this rank's:
 * partners that combine this way compute the same expression, in recursive doubling and in the
 * halving rounds alike. */
static void combine(char *dst, const char *mine, const char *theirs, int mine_is_lower,
                    size_t count, hoop_dtype dtype, hoop_op op) {
  if (mine_is_lower)
    hoop__reduce3(dst, mine, theirs, count, dtype, op);
  else
    hoop__reduce3(dst, theirs, mine, count, dtype, op);
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
  char *staging = hoop__scratch(comm, bytes);
  if (!staging)
    return HOOP_ERR_SYSTEM;
  hoop__halving plan; /* only its pairing is used: p, rem and the virtual ranks */
  hoop__halving_plan(comm, count, &plan);
  hoop__request req;
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
    result = hoop__irecv(comm, r - 1, staging, bytes, &req);
    if (result == HOOP_OK)
      result = hoop__wait(comm, &req);
    if (result != HOOP_OK)
      return result;
    combine(buf, buf, staging, 0, count, dtype, op);
  }
  for (int mask = 1; mask < plan.p; mask <<= 1) {
    int peer = hoop__halving_rank(&plan, plan.vrank ^ mask);
    result = hoop__sendrecv(comm, peer, buf, bytes, peer, staging, bytes);
    if (result != HOOP_OK)
      return result;
    combine(buf, buf, staging, r < peer, count, dtype, op);
  }
  hoop__reduce_finish(buf, count, dtype, op, comm->size);
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

/* One round between this rank and peer: send [give, give + give_len) in chunks, receive the
 * peer's chunks of the kept range into staging (HOOP_RING_RECV_DEPTH slices of slice bytes) and
 * reduce each as it lands: dst = op(lower rank's part, higher rank's part), where this rank's part
 * is src. The peer cuts its sends the same way, from the same range lengths. */
static hoop_result halving_round(hoop_comm *comm, hoop__arena *arena, int peer, const char *give,
                                 size_t give_len, char *dst, const char *src, size_t keep_len,
                                 char *staging, size_t slice, hoop_dtype dtype, hoop_op op) {
  size_t esize = hoop_dtype_size(dtype);
  hoop_result result = hoop__arena_isend_chunks(comm, arena, peer, give, give_len, esize);
  size_t chunk = hoop__chunk_bytes(comm, keep_len, esize);
  size_t chunks = (keep_len + chunk - 1) / chunk;
  hoop__request reqs[HOOP_RING_RECV_DEPTH];
  size_t posted = 0;
  int mine_is_lower = comm->rank < peer;
  for (size_t k = 0; k < chunks && result == HOOP_OK; k++) {
    for (; posted < chunks && posted < k + HOOP_RING_RECV_DEPTH && result == HOOP_OK; posted++) {
      size_t at = posted * chunk;
      result = hoop__irecv(comm, peer, staging + (posted % HOOP_RING_RECV_DEPTH) * slice,
                           keep_len - at < chunk ? keep_len - at : chunk,
                           &reqs[posted % HOOP_RING_RECV_DEPTH]);
    }
    if (result == HOOP_OK)
      result = hoop__wait(comm, &reqs[k % HOOP_RING_RECV_DEPTH]);
    if (result != HOOP_OK)
      break;
    size_t at = k * chunk, len = keep_len - at < chunk ? keep_len - at : chunk;
    combine(dst + at, src + at, staging + (k % HOOP_RING_RECV_DEPTH) * slice, mine_is_lower,
            len / esize, dtype, op);
  }
  return result;
}

/* Sends need not be waited for round by round: a range this rank gave away in the halving round
 * with mask m is written again only in the doubling round with mask m, by the same partner, which
 * sends it only after it has received all of that range. */
static hoop_result halving_doubling(hoop_comm *comm, hoop__arena *arena, const char *sendbuf,
                                    char *recvbuf, size_t count, hoop_dtype dtype, hoop_op op) {
  int r = comm->rank;
  size_t esize = hoop_dtype_size(dtype), bytes = count * esize;
  /* Every range a round receives is at most the whole buffer, so its chunks are at most this. */
  size_t slice = hoop__chunk_bytes(comm, bytes, esize);
  char *staging = hoop__scratch(comm, HOOP_RING_RECV_DEPTH * slice);
  if (!staging)
    return HOOP_ERR_SYSTEM;
  hoop__halving plan;
  hoop__halving_plan(comm, count, &plan);
  hoop_result result;
  if (plan.folded) {
    hoop__request req;
    result = hoop__arena_isend_chunks(comm, arena, r + 1, sendbuf, bytes, esize);
    if (result == HOOP_OK)
      result = hoop__irecv(comm, r + 1, recvbuf, bytes, &req);
    return result == HOOP_OK ? hoop__wait(comm, &req) : result;
  }
  const char *src = sendbuf; /* this rank's contribution, until the first reduction lands */
  if (r < 2 * plan.rem) {
    result = halving_round(comm, arena, r - 1, NULL, 0, recvbuf, sendbuf, bytes, staging, slice,
                           dtype, op);
    if (result != HOOP_OK)
      return result;
    src = recvbuf;
  }
  for (int round = 0; round < plan.rounds; round++) {
    int mask = plan.p >> (round + 1);
    int peer = hoop__halving_rank(&plan, plan.vrank ^ mask);
    size_t keep_first = round + 1 < plan.rounds ? plan.lo[round + 1] : plan.first;
    size_t keep_last = round + 1 < plan.rounds ? plan.hi[round + 1] : plan.last;
    size_t give_first = plan.vrank & mask ? plan.lo[round] : keep_last;
    size_t give_last = plan.vrank & mask ? keep_first : plan.hi[round];
    result =
        halving_round(comm, arena, peer, src + give_first * esize, (give_last - give_first) * esize,
                      recvbuf + keep_first * esize, src + keep_first * esize,
                      (keep_last - keep_first) * esize, staging, slice, dtype, op);
    if (result != HOOP_OK)
      return result;
    src = recvbuf;
  }
  hoop__reduce_finish(recvbuf + plan.first * esize, plan.last - plan.first, dtype, op, comm->size);
  result = hoop__doubling_rounds(comm, arena, recvbuf, esize, &plan);
  if (result == HOOP_OK && r < 2 * plan.rem)
    result = hoop__arena_isend(comm, arena, r - 1, recvbuf, bytes);
  return result;
}

static hoop_result check_args(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                              hoop_op op) {
  if ((unsigned)op >= HOOP_OP_COUNT)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "hoop_allreduce: unknown op %d", (int)op);
  if (count > 0 && (!sendbuf || !recvbuf))
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "hoop_allreduce: %s is NULL with count %zu",
                           sendbuf ? "recvbuf" : "sendbuf", count);
  return HOOP_OK;
}

hoop_result hoop_allreduce(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                           hoop_dtype dtype, hoop_op op) {
  hoop_result result = hoop__coll_begin(comm, "hoop_allreduce", count, dtype, 1);
  if (result == HOOP_OK)
    hoop__coll_describe(comm, (int)op, -1);
  if (result == HOOP_OK)
    result = check_args(comm, sendbuf, recvbuf, count, op);
  if (result != HOOP_OK)
    return hoop__coll_end(comm, result);
  if (count == 0)
    return hoop__coll_end(comm, hoop__coll_no_data(comm));
  size_t esize = hoop_dtype_size(dtype);
  if (comm->size == 1) {
    if (sendbuf != recvbuf)
      memmove(recvbuf, sendbuf, count * esize);
    return hoop__coll_end(comm, HOOP_OK);
  }
  hoop__algo algo;
  if ((result = hoop__coll_tuning(comm, &algo)) != HOOP_OK)
    return hoop__coll_end(comm, result);
  algo = choose(comm, algo, count * esize);
  if (algo == HOOP__ALGO_HD) {
    hoop__arena arena = {0};
    result = halving_doubling(comm, &arena, sendbuf, recvbuf, count, dtype, op);
    if (result == HOOP_OK)
      result = hoop__arena_wait_all(comm, &arena);
    hoop__arena_free(&arena);
    return hoop__coll_end(comm, result);
  }
  if (algo == HOOP__ALGO_RD) {
    if (sendbuf != recvbuf)
      memmove(recvbuf, sendbuf, count * esize);
    return hoop__coll_end(comm, recursive_doubling(comm, recvbuf, count, dtype, op));
  }
  ring_plan plan;
  plan_segments(comm, count, esize, &plan);
  /* Segment 0 is never smaller than the others, so its chunk is the largest. */
  size_t chunk_max = hoop__chunk_bytes(comm, plan.length[0], esize);
  char *staging = hoop__scratch(comm, HOOP_RING_RECV_DEPTH * chunk_max);
  if (!staging)
    return hoop__coll_end(comm, HOOP_ERR_SYSTEM);

  hoop__arena arena = {0};
  result = reduce_scatter(comm, &arena, sendbuf, recvbuf, &plan, staging, chunk_max, dtype, op);
  if (result == HOOP_OK)
    result = hoop__ring_circulate(comm, &arena, recvbuf, plan.offset, plan.length, 1, esize, 1);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  hoop__arena_free(&arena);
  return hoop__coll_end(comm, result);
}
