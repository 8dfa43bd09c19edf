/* broadcast.c - hoop_broadcast: a binomial tree for small messages (log2(n) rounds of latency) and
 * a pipelined chain from the root around the ring for large ones (every link carries the buffer
 * once, so the time approaches bytes / link bandwidth whatever the rank count). A job crowded onto
 * one host (more ranks than CPUs) keeps the tree at every size: there is no link to fill, both
 * move the same bytes through the same kernel copies, and the chain's ranks, taking turns on the
 * cores, pay a wakeup per chunk per hop. 4 ranks on 2 CPUs over loopback, p50 tree/chain:
 * 1 MiB 0.52/0.91 ms, 4 MiB 2.4/3.8 ms, 64 MiB 43/50 ms. */
#include "coll/coll.h"

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

/* Receives the chain keeps posted ahead of the chunk it is forwarding, so that the next chunk's
 * bytes (striped over several streams by TCP) are drained while this one is passed on. */
#define CHAIN_RECV_DEPTH 4

/* The last rank of the chain starts receiving n-2 chunk times after the first, so a chunk of
 * bytes/CHAIN_MIN_CHUNKS keeps that fill under a few percent of the whole (measured on 4 namespace
 * hosts at 1 Gbit/s: 16 MiB went from 81% of the link with 1 MiB chunks to 96% with 128 KiB).
 * HOOP_CHUNK_BYTES stays the upper bound; CHAIN_CHUNK_FLOOR keeps per-message costs small. */
#define CHAIN_MIN_CHUNKS 128
#define CHAIN_CHUNK_FLOOR (64 * 1024)

static size_t chain_chunk_bytes(const hoop_comm *comm, size_t bytes) {
  size_t chunk = bytes / CHAIN_MIN_CHUNKS;
  if (chunk < CHAIN_CHUNK_FLOOR)
    chunk = CHAIN_CHUNK_FLOOR;
  size_t limit = hoop__chunk_bytes(comm, bytes, 1);
  return chunk < limit ? chunk : limit;
}

static hoop_result chain(hoop_comm *comm, char *buf, size_t bytes, int root) {
  int n = comm->size;
  int vrank = (comm->rank - root + n) % n;
  int next = hoop__ring_next(comm), prev = hoop__ring_prev(comm);
  int forwards = vrank < n - 1; /* the last rank of the chain only receives */
  size_t chunk = chain_chunk_bytes(comm, bytes);
  size_t chunks = (bytes + chunk - 1) / chunk;
  hoop__request recvs[CHAIN_RECV_DEPTH];
  size_t posted = 0; /* chunks whose receive has been posted */
  hoop__arena arena = {0};
  hoop_result result = HOOP_OK;
  for (size_t k = 0; k < chunks && result == HOOP_OK; k++) {
    size_t done = k * chunk, len = bytes - done < chunk ? bytes - done : chunk;
    if (vrank != 0) {
      for (; posted < chunks && posted < k + CHAIN_RECV_DEPTH && result == HOOP_OK; posted++) {
        size_t at = posted * chunk;
        result = hoop__irecv(comm, prev, buf + at, bytes - at < chunk ? bytes - at : chunk,
                             &recvs[posted % CHAIN_RECV_DEPTH]);
      }
      if (result == HOOP_OK)
        result = hoop__wait(comm, &recvs[k % CHAIN_RECV_DEPTH]);
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
    return hoop__coll_end(comm,
                          hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                                          "hoop_broadcast: buf is NULL with count %zu", count));
  size_t bytes = count * hoop_dtype_size(dtype);
  if (bytes == 0)
    return hoop__coll_end(comm, hoop__coll_no_data(comm));
  if (comm->size == 1)
    return hoop__coll_end(comm, HOOP_OK);
  hoop__algo algo;
  if ((result = hoop__coll_tuning(comm, &algo)) != HOOP_OK)
    return hoop__coll_end(comm, result);
  /* Broadcast has no halving-doubling of its own: HOOP_ALGO=hd gives it the log2(n) rounds. */
  if (algo == HOOP__ALGO_RD || algo == HOOP__ALGO_HD ||
      (algo == HOOP__ALGO_AUTO &&
       (bytes < BCAST_CHAIN_MIN_BYTES || comm->size == 2 || comm->crowded)))
    result = binomial_tree(comm, buf, bytes, root);
  else
    result = chain(comm, buf, bytes, root);
  return hoop__coll_end(comm, result);
}
