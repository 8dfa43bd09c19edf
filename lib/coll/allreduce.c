/* allreduce.c - hoop_allreduce: for large buffers a ring reduce-scatter followed by a ring
 * allgather, both pipelined in chunks, so that each rank sends and receives 2(n-1)/n of the buffer,
 * the bandwidth optimum; for small ones recursive doubling, log2(n) exchanges of the whole buffer,
 * the latency optimum.
 *
 * Reduce-scatter: at step s rank r receives from the previous rank a chunk of segment r-s-1 that
 * holds the sum of s+1 ranks' contributions, adds its own (reading sendbuf, writing recvbuf, so the
 * out-of-place case needs no initial copy), and forwards the sum at once. After n-1 steps rank r
 * holds the full result of segment r+1, which the allgather circulates.
 */
#include <string.h>

#include "coll.h"
#include "reduce.h"

/* Up to this size recursive doubling beats the ring. Measured with hoop-bench on loopback
 * (HOOP_ALGO=ring vs rd, 1 MiB chunks): at 2 ranks they tie at 256 KiB and the ring wins from
 * 1 MiB; at 4 ranks recursive doubling is 3x faster at 32 KiB and still ahead at 256 KiB, and they
 * tie at 512 KiB. */
#define RD_MAX_BYTES (256 * 1024)

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
  size_t chunk = hoop__chunk_bytes(comm, plan->length[r], esize);
  hoop_result result = HOOP_OK;
  for (size_t done = 0; done < plan->length[r] && result == HOOP_OK; done += chunk) {
    size_t len = plan->length[r] - done < chunk ? plan->length[r] - done : chunk;
    result = hoop__arena_isend(comm, arena, next, src + plan->offset[r] + done, len);
  }
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
      if (!hoop__ring_cursor_next(comm, &posting, plan->offset, plan->length, 0, esize,
                                  &steps[k], &ats[k], &lens[k]))
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

/* Recursive doubling. With p the largest power of two <= n and rem = n - p, the first 2*rem ranks
 * pair up first: each even one hands its buffer to the odd one above and waits for the result, so
 * p ranks remain. In round k each of them exchanges its partial result with the rank whose virtual
 * number differs in bit k and combines the two. Partners always combine as op(lower rank's part,
 * higher rank's part), so every rank computes the same expression and ends with the same bits,
 * NaNs in min/max and float rounding included. */
static int rd_actual_rank(int vrank, int rem) {
  return vrank < rem ? 2 * vrank + 1 : vrank + rem;
}

static void rd_combine(char *mine, const char *theirs, int mine_is_lower, size_t count,
                       hoop_dtype dtype, hoop_op op) {
  if (mine_is_lower)
    hoop__reduce3(mine, mine, theirs, count, dtype, op);
  else
    hoop__reduce3(mine, theirs, mine, count, dtype, op);
}

static hoop_result recursive_doubling(hoop_comm *comm, char *buf, size_t count, hoop_dtype dtype,
                                      hoop_op op) {
  int n = comm->size, r = comm->rank;
  size_t bytes = count * hoop_dtype_size(dtype);
  char *staging = hoop__scratch(comm, bytes);
  if (!staging)
    return HOOP_ERR_SYSTEM;
  int p = 1;
  while (p * 2 <= n)
    p *= 2;
  int rem = n - p;
  hoop__request req;
  hoop_result result;
  if (r < 2 * rem && r % 2 == 0) {
    result = hoop__isend(comm, r + 1, buf, bytes, &req);
    if (result == HOOP_OK)
      result = hoop__wait(comm, &req);
    if (result == HOOP_OK)
      result = hoop__irecv(comm, r + 1, buf, bytes, &req);
    return result == HOOP_OK ? hoop__wait(comm, &req) : result;
  }
  if (r < 2 * rem) {
    result = hoop__irecv(comm, r - 1, staging, bytes, &req);
    if (result == HOOP_OK)
      result = hoop__wait(comm, &req);
    if (result != HOOP_OK)
      return result;
    rd_combine(buf, staging, 0, count, dtype, op);
  }
  int vrank = r < 2 * rem ? r / 2 : r - rem;
  for (int mask = 1; mask < p; mask <<= 1) {
    int peer = rd_actual_rank(vrank ^ mask, rem);
    result = hoop__sendrecv(comm, peer, buf, bytes, peer, staging, bytes);
    if (result != HOOP_OK)
      return result;
    rd_combine(buf, staging, r < peer, count, dtype, op);
  }
  hoop__reduce_finish(buf, count, dtype, op, n);
  if (r < 2 * rem) {
    result = hoop__isend(comm, r - 1, buf, bytes, &req);
    if (result == HOOP_OK)
      result = hoop__wait(comm, &req);
  }
  return result;
}

static hoop_result check_args(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                              hoop_op op) {
  if ((unsigned)op >= HOOP_OP_COUNT)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "hoop_allreduce: unknown op %d", (int)op);
  if (count > 0 && (!sendbuf || !recvbuf))
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_allreduce: %s is NULL with count %zu",
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
  if (algo == HOOP__ALGO_RD ||
      (algo == HOOP__ALGO_AUTO && count * esize <= RD_MAX_BYTES)) {
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
