/* broadcast.c - hoop_broadcast: a binomial tree for small messages (log2(n) rounds of latency) and
 * a pipelined chain from the root around the ring for large ones (every link carries the buffer
 * once, so the time approaches bytes / link bandwidth whatever the rank count). */
#include "coll.h"

/* Below this many bytes the tree's fewer hops beat the chain's pipelining. */
#define BCAST_CHAIN_MIN_BYTES (64 * 1024)

static hoop_result binomial_tree(hoop_comm *comm, char *buf, size_t bytes, int root) {
  int n = comm->size;
  int vrank = (comm->rank - root + n) % n; /* rank relative to the root */
  int mask = 1;
  hoop_result result = HOOP_OK;
  /* Receive once, from the rank that differs in this rank's lowest set bit. */
  while (mask < n) {
    if (vrank & mask) {
      hoop__request req;
      int from = (vrank - mask + root) % n;
      result = hoop__irecv(comm, from, buf, bytes, &req);
      if (result == HOOP_OK)
        result = hoop__wait(comm, &req);
      break;
    }
    mask <<= 1;
  }
  /* Then pass it on to the subtrees below that bit, largest first. */
  hoop__arena arena = {0};
  for (mask >>= 1; mask > 0 && result == HOOP_OK; mask >>= 1)
    if (vrank + mask < n)
      result = hoop__arena_isend(comm, &arena, (vrank + mask + root) % n, buf, bytes);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  hoop__arena_free(&arena);
  return result;
}

static hoop_result chain(hoop_comm *comm, char *buf, size_t bytes, int root) {
  int n = comm->size;
  int vrank = (comm->rank - root + n) % n;
  int next = hoop__ring_next(comm), prev = hoop__ring_prev(comm);
  int forwards = vrank < n - 1; /* the last rank of the chain only receives */
  size_t chunk = hoop__chunk_bytes(comm, bytes, 1);
  hoop__arena arena = {0};
  hoop_result result = HOOP_OK;
  for (size_t done = 0; done < bytes && result == HOOP_OK; done += chunk) {
    size_t len = bytes - done < chunk ? bytes - done : chunk;
    if (vrank != 0) {
      hoop__request req;
      result = hoop__irecv(comm, prev, buf + done, len, &req);
      if (result == HOOP_OK)
        result = hoop__wait(comm, &req);
    }
    if (result == HOOP_OK && forwards)
      result = hoop__arena_isend(comm, &arena, next, buf + done, len);
  }
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  hoop__arena_free(&arena);
  return result;
}

hoop_result hoop_broadcast(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype, int root) {
  hoop_result result = hoop__coll_begin(comm, "hoop_broadcast", count, dtype, 1);
  if (result != HOOP_OK)
    return hoop__coll_end(comm, result);
  hoop__coll_describe(comm, -1, root);
  if (root < 0 || root >= comm->size)
    return hoop__coll_end(comm, hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                                                "hoop_broadcast: root %d is not in 0..%d", root,
                                                comm->size - 1));
  if (count > 0 && !buf)
    return hoop__coll_end(comm, hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                                                "hoop_broadcast: buf is NULL with count %zu",
                                                count));
  size_t bytes = count * hoop_dtype_size(dtype);
  if (bytes == 0)
    return hoop__coll_end(comm, hoop__coll_no_data(comm));
  if (comm->size == 1)
    return hoop__coll_end(comm, HOOP_OK);
  hoop__algo algo;
  if ((result = hoop__coll_tuning(comm, &algo)) != HOOP_OK)
    return hoop__coll_end(comm, result);
  if (algo == HOOP__ALGO_RD ||
      (algo == HOOP__ALGO_AUTO && (bytes < BCAST_CHAIN_MIN_BYTES || comm->size == 2)))
    result = binomial_tree(comm, buf, bytes, root);
  else
    result = chain(comm, buf, bytes, root);
  return hoop__coll_end(comm, result);
}
